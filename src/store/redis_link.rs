//! A connection to a Redis server that reads no more of a reply than it
//! was asked for (feature `redis`).
//!
//! The `redis` crate's own connection reads a whole reply into memory
//! before anyone sees it, whatever its length: a server (or whoever sits
//! on the network path) answering a lookup with 300 MB costs the client
//! 300 MB. A [`Link`] speaks the same protocol (RESP2, parsed by the
//! crate's own [`redis::Parser`]) over a socket it opens itself, and
//! bounds what it reads.
//!
//! # What this module guarantees
//!
//! 1. **Bounded replies.** A request's replies are read through a byte
//!    budget: for each reply, at most the link's reply limit (the largest
//!    value and its framing) is read from the socket (what the parser
//!    reads ahead of a reply counts toward the one before), so a request
//!    of `n` replies reads at most `n` limits, as `n` values of the
//!    largest size would take, and no reply holds more than two. A
//!    request whose replies each hold up to `k` values (a script's array,
//!    [`Link::expect_values_per_reply`]) gets `k` limits for each. Past its
//!    budget, reading stops, the request fails with an I/O error, and the
//!    link is closed and says it was cut off ([`Link::was_cut_off`]). What
//!    a request holds in memory is proportional to what it read.
//! 2. **Bounded waits.** Connecting to each address a host name resolves
//!    to waits at most the connect timeout. A request (writing it and
//!    reading its replies) is allowed the I/O timeout and a microsecond
//!    for each byte it moves ([`MICROS_PER_BYTE`]: a server that answers
//!    at least 1 MB a second is never cut short), and takes at most half
//!    an I/O timeout more, whatever the server does: one that trickles
//!    its answer a byte at a time, each within the I/O timeout, times
//!    out all the same. (The socket's timeouts are cut to the time left
//!    only once that is under half the I/O timeout, so that a request
//!    answered in time makes no more system calls than reads and
//!    writes.)
//! 3. **A link that failed is closed**: after any error (I/O, a reply
//!    that does not parse, one over its budget) [`redis::ConnectionLike::is_open`]
//!    is false, and the link answers every later request with an error
//!    without touching the socket (a late answer may still be on it).
//! 4. The handshake a URL asks for is made: `AUTH` with its user and
//!    password, `SELECT` of its database; their replies are bounded too.
//!    The protocol spoken is RESP2 whatever the URL asks for (a RESP3
//!    server answers RESP2 clients the same). TLS is not supported: such
//!    an address is an error of the connect.

use redis::{ConnectionAddr, ConnectionInfo, ErrorKind, RedisError, RedisResult, Value};
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Bytes a reply of a value of the largest length takes beyond the value
/// (its type, length and line ends: `$` and up to 20 digits, then two
/// line ends), with room to spare.
const REPLY_FRAMING_BYTES: u64 = 64;

/// What a request may take for each byte it writes or reads, beyond the
/// I/O timeout (see 2 in the module docs): a microsecond, 1 MB a second.
pub(super) const MICROS_PER_BYTE: u64 = 1;

/// A socket to a server.
enum Socket {
    Tcp(TcpStream),
    #[cfg(unix)]
    Unix(std::os::unix::net::UnixStream),
}

impl Socket {
    fn set_timeouts(&self, io: Duration) -> io::Result<()> {
        match self {
            Socket::Tcp(s) => {
                s.set_read_timeout(Some(io))?;
                s.set_write_timeout(Some(io))
            }
            #[cfg(unix)]
            Socket::Unix(s) => {
                s.set_read_timeout(Some(io))?;
                s.set_write_timeout(Some(io))
            }
        }
    }

    fn shutdown(&self) {
        let _ = match self {
            Socket::Tcp(s) => s.shutdown(std::net::Shutdown::Both),
            #[cfg(unix)]
            Socket::Unix(s) => s.shutdown(std::net::Shutdown::Both),
        };
    }
}

impl Read for Socket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Socket::Tcp(s) => s.read(buf),
            #[cfg(unix)]
            Socket::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Socket {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Socket::Tcp(s) => s.write(buf),
            #[cfg(unix)]
            Socket::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The socket of one request, whose reads and writes end at its deadline
/// (see 2 in the module docs): each waits at most the time left, and
/// none starts past it.
struct Paced<'s> {
    socket: &'s mut Socket,
    io_timeout: Duration,
    start: Instant,
    /// Bytes written and read so far.
    moved: u64,
    /// The socket's timeouts, where they were cut below the I/O timeout
    /// (put back when the request ends).
    shortened: Option<Duration>,
}

impl<'s> Paced<'s> {
    fn new(socket: &'s mut Socket, io_timeout: Duration) -> Self {
        Self {
            socket,
            io_timeout,
            start: Instant::now(),
            moved: 0,
            shortened: None,
        }
    }

    /// Before a read or write: an error past the request's deadline;
    /// otherwise the socket waits at most the time left, once that is
    /// under half the I/O timeout (above, the socket's own I/O timeout
    /// stands, and no system call is made: a request so ends at most half
    /// an I/O timeout past its deadline).
    fn pace(&mut self) -> io::Result<()> {
        let allowed = self.io_timeout.saturating_add(Duration::from_micros(
            self.moved.saturating_mul(MICROS_PER_BYTE),
        ));
        let left = allowed.saturating_sub(self.start.elapsed());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the server answers slower than a request may take",
            ));
        }
        let wait = if left < self.io_timeout / 2 {
            Some(left)
        } else {
            None
        };
        if wait != self.shortened {
            self.socket.set_timeouts(wait.unwrap_or(self.io_timeout))?;
            self.shortened = wait;
        }
        Ok(())
    }
}

impl Drop for Paced<'_> {
    fn drop(&mut self) {
        if self.shortened.is_some() {
            // Should this fail, the next request times out early: an
            // error of that request, never a longer wait.
            let _ = self.socket.set_timeouts(self.io_timeout);
        }
    }
}

impl Read for Paced<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.pace()?;
        let read = self.socket.read(buf)?;
        self.moved += read as u64;
        Ok(read)
    }
}

impl Write for Paced<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.pace()?;
        let written = self.socket.write(buf)?;
        self.moved += written as u64;
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A reader that reads at most `left` more bytes, then fails (see 1 in
/// the module docs).
struct Budgeted<R> {
    inner: R,
    left: u64,
}

impl<R: Read> Read for Budgeted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a reply longer than the store asked for",
            ));
        }
        let most = usize::try_from(self.left).map_or(buf.len(), |left| left.min(buf.len()));
        let read = self.inner.read(&mut buf[..most])?;
        self.left -= read as u64;
        Ok(read)
    }
}

/// Reads `count` replies from `reader` with `parser`, reading at most
/// `reply_limit` bytes for each (see 1 in the module docs); also whether
/// reading stopped at the budget.
fn read_replies(
    parser: &mut redis::Parser,
    reader: impl Read,
    reply_limit: u64,
    count: usize,
) -> (RedisResult<Vec<Value>>, bool) {
    let mut reader = Budgeted {
        inner: reader,
        left: 0,
    };
    let mut replies = Vec::with_capacity(count.min(4096));
    for _ in 0..count {
        reader.left = reply_limit;
        match parser.parse_value(&mut reader) {
            Ok(reply) => replies.push(reply),
            Err(e) => return (Err(e), reader.left == 0),
        }
    }
    (Ok(replies), false)
}

/// A connection to a Redis server whose replies are bounded: see the
/// [module docs](self).
pub(super) struct Link {
    socket: Socket,
    parser: redis::Parser,
    /// The most one reply may take, value and framing.
    reply_limit: u64,
    /// What a request may take, beyond its bytes (see 2 in the module
    /// docs).
    io_timeout: Duration,
    /// How many values each reply of the next request may hold (see 1 in
    /// the module docs); one after every request.
    values_per_reply: u64,
    db: i64,
    open: bool,
    /// Whether a reply went over its budget (see 1 in the module docs).
    cut_off: bool,
}

impl Link {
    /// A link to the server `info` names, whose replies each take at most
    /// `max_value_bytes` of value (see 1 in the module docs), handshaken
    /// (see 4).
    pub(super) fn connect(
        info: &ConnectionInfo,
        connect_timeout: Duration,
        io_timeout: Duration,
        max_value_bytes: u64,
    ) -> RedisResult<Link> {
        let socket = match info.addr() {
            ConnectionAddr::Tcp(host, port) => {
                Socket::Tcp(connect_tcp(host, *port, connect_timeout)?)
            }
            #[cfg(unix)]
            ConnectionAddr::Unix(path) => {
                Socket::Unix(std::os::unix::net::UnixStream::connect(path)?)
            }
            other => {
                return Err(RedisError::from((
                    ErrorKind::InvalidClientConfig,
                    "an address jitfold's Redis store cannot connect to (TLS is not built in)",
                    other.to_string(),
                )));
            }
        };
        socket.set_timeouts(io_timeout)?;
        let settings = info.redis_settings();
        let mut link = Link {
            socket,
            parser: redis::Parser::new(),
            reply_limit: max_value_bytes.saturating_add(REPLY_FRAMING_BYTES),
            values_per_reply: 1,
            io_timeout,
            db: settings.db(),
            open: true,
            cut_off: false,
        };
        if let Some(password) = settings.password() {
            let mut auth = redis::cmd("AUTH");
            if let Some(user) = settings.username() {
                auth.arg(user);
            }
            auth.arg(password).exec(&mut link)?;
        }
        if link.db != 0 {
            redis::cmd("SELECT").arg(link.db).exec(&mut link)?;
        }
        Ok(link)
    }

    /// Sends `request` and reads `count` replies (see 1 in the module
    /// docs), closing the link on any error (see 3).
    fn request(&mut self, request: &[u8], count: usize) -> RedisResult<Vec<Value>> {
        if !self.open {
            return Err(RedisError::from(io::Error::from(
                io::ErrorKind::NotConnected,
            )));
        }
        let answered = self.send_and_read(request, count);
        if answered.is_err() {
            self.open = false;
            self.socket.shutdown();
        }
        answered
    }

    fn send_and_read(&mut self, request: &[u8], count: usize) -> RedisResult<Vec<Value>> {
        let values = std::mem::replace(&mut self.values_per_reply, 1);
        let mut socket = Paced::new(&mut self.socket, self.io_timeout);
        socket.write_all(request)?;
        let limit = self.reply_limit.saturating_mul(values);
        let (replies, cut_off) = read_replies(&mut self.parser, &mut socket, limit, count);
        self.cut_off = cut_off;
        replies
    }

    /// Lets each reply of the next request (and only that one) hold
    /// `values` values of the largest size (an array of them, answered
    /// by a script), rather than one (see 1 in the module docs).
    pub(super) fn expect_values_per_reply(&mut self, values: usize) {
        self.values_per_reply = u64::try_from(values).unwrap_or(u64::MAX).max(1);
    }

    /// Whether a request went over its budget, and the link was closed for
    /// it (see 1 in the module docs): the server answered more than it was
    /// asked.
    pub(super) fn was_cut_off(&self) -> bool {
        self.cut_off
    }
}

/// A TCP connection to `host`:`port`, trying each address it resolves to
/// for at most `timeout` (see 2 in the module docs).
fn connect_tcp(host: &str, port: u16, timeout: Duration) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, "the host resolves to no address");
    for address in (host, port).to_socket_addrs()? {
        match TcpStream::connect_timeout(&address, timeout) {
            Ok(stream) => {
                // Requests are written whole; replies are awaited.
                stream.set_nodelay(true)?;
                return Ok(stream);
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

impl redis::ConnectionLike for Link {
    fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        let mut replies = self.request(cmd, 1)?;
        Ok(replies.pop().unwrap_or(Value::Nil))
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        let mut replies = self.request(cmd, offset.saturating_add(count))?;
        Ok(replies.split_off(offset.min(replies.len())))
    }

    fn get_db(&self) -> i64 {
        self.db
    }

    fn check_connection(&mut self) -> bool {
        redis::cmd("PING").exec(self).is_ok()
    }

    fn is_open(&self) -> bool {
        self.open
    }
}

#[cfg(test)]
mod tests {
    use super::read_replies;
    use redis::Value;

    /// Replies of `lens` bytes of value each, as a server sends them.
    fn replies(lens: &[usize]) -> Vec<u8> {
        let mut out = Vec::new();
        for &len in lens {
            out.extend_from_slice(format!("${len}\r\n").as_bytes());
            out.extend(std::iter::repeat_n(b'x', len));
            out.extend_from_slice(b"\r\n");
        }
        out
    }

    /// Reads `count` replies from `bytes` with a limit of `limit` bytes a
    /// reply: the values' lengths, or whether it was cut off.
    fn read(bytes: &[u8], limit: u64, count: usize) -> Result<Vec<usize>, bool> {
        let mut parser = redis::Parser::new();
        match read_replies(&mut parser, bytes, limit, count) {
            (Ok(values), _) => Ok(values
                .into_iter()
                .map(|v| match v {
                    Value::BulkString(b) => b.len(),
                    other => panic!("{other:?}"),
                })
                .collect()),
            (Err(_), cut_off) => Err(cut_off),
        }
    }

    #[test]
    fn each_reply_reads_at_most_one_limit() {
        // `$100\r\n`, the value, `\r\n`: 108 bytes.
        assert_eq!(read(&replies(&[100]), 108, 1), Ok(vec![100]));
        assert_eq!(read(&replies(&[100]), 107, 1), Err(true));
        assert_eq!(read(&replies(&[100, 100]), 108, 2), Ok(vec![100, 100]));
        // What the parser read ahead of a short reply is the next one's:
        // a reply holds at most two limits.
        assert_eq!(read(&replies(&[10, 150]), 108, 2), Ok(vec![10, 150]));
        assert_eq!(read(&replies(&[10, 250]), 108, 2), Err(true));
        // A reply that ends early is an error, not a cut.
        assert_eq!(read(&replies(&[100])[..50], 1000, 1), Err(false));
    }
}
