//! The independent oracle: a canonical *text* of a function, built from
//! Cranelift's printer alone, without the fingerprint encoder.
//!
//! Rule: print the function; drop its name, source locations and comments;
//! resolve value aliases; keep the blocks reachable from the entry in DFS
//! pre-order (destinations read from each block's last line, in order);
//! replace every side-table reference by its (recursively expanded)
//! definition, tagged with its first-appearance number (signatures and
//! external functions by their expanded definition, so that equal
//! declarations are one, with `func_addr` also naming which declaration
//! it uses); write the frame as Cranelift lays it out, stack
//! slots in index order (but for the parser's empty placeholders, `ss =
//! explicit_slot 0`) and then dynamic stack slots in index order, and a
//! slot use as its place in that list; finally rename values and blocks by
//! first appearance. Two valid functions should have equal fingerprints
//! exactly when this text is equal.

use cranelift_codegen::ir::Function;
use regex::{Captures, Regex};
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};

/// The parser's placeholder for a gap in `ssN` numbering, as printed.
const EMPTY_SLOT: &str = "explicit_slot 0";

pub fn canonical_text(func: &Function) -> String {
    let printed = func.display().to_string();
    let entity = Regex::new(r"\b(ss|dss|dt|gv|sig|fn|fa|const|region)(\d+)\b").unwrap();
    let block_re = Regex::new(r"\bblock\d+\b").unwrap();
    let value_re = Regex::new(r"\bv\d+\b").unwrap();
    let srcloc = Regex::new(r"^\s*@[0-9a-f]+\s+").unwrap();

    let mut lines = printed.lines();
    let header = lines.next().unwrap();
    let header = Regex::new(r"^function \S+?\(")
        .unwrap()
        .replace(header, "function (")
        .to_string();

    let mut defs: HashMap<String, String> = HashMap::new();
    let mut stack_limit = None;
    let mut blocks: Vec<(String, Vec<String>)> = Vec::new();
    let mut aliases: HashMap<String, String> = HashMap::new();
    for line in lines {
        let line = srcloc.replace(line, "");
        let line = match line.find(';') {
            Some(i) => &line[..i],
            None => &line[..],
        };
        let line = line.trim();
        if line.is_empty() || line == "}" {
            continue;
        }
        if line.starts_with("block") && line.ends_with(':') {
            blocks.push((line.to_string(), Vec::new()));
        } else if let Some((lhs, rhs)) = line
            .split_once(" -> ")
            .filter(|(l, _)| value_re.is_match(l) && !l.contains('='))
        {
            aliases.insert(lhs.trim().to_string(), rhs.trim().to_string());
        } else if blocks.is_empty() {
            let (name, def) = line.split_once(" = ").unwrap();
            if name == "stack_limit" {
                stack_limit = Some(def.to_string());
            } else {
                defs.insert(name.to_string(), def.to_string());
            }
        } else {
            blocks.last_mut().unwrap().1.push(line.to_string());
        }
    }

    // Blocks reachable from the entry, DFS pre-order.
    let name_of = |header: &str| block_re.find(header).unwrap().as_str().to_string();
    let index: HashMap<String, usize> = blocks
        .iter()
        .enumerate()
        .map(|(i, b)| (name_of(&b.0), i))
        .collect();
    let mut order = Vec::new();
    let mut seen = HashSet::new();
    let mut stack = vec![0usize];
    while let Some(i) = stack.pop() {
        if !seen.insert(i) {
            continue;
        }
        order.push(i);
        let last = blocks[i].1.last().map(String::as_str).unwrap_or("");
        let succs: Vec<usize> = block_re
            .find_iter(last)
            .map(|m| index[m.as_str()])
            .collect();
        stack.extend(succs.into_iter().rev());
    }

    let mut body = String::new();
    if let Some(gv) = &stack_limit {
        body.push_str(&format!("stack_limit {gv}\n"));
    }
    // The frame, in index order.
    let indexed = |kind: &str| {
        let mut slots: Vec<(u32, &String)> = defs
            .iter()
            .filter_map(|(name, def)| Some((name.strip_prefix(kind)?.parse().ok()?, def)))
            .collect();
        slots.sort();
        slots
    };
    let mut slot_place: HashMap<String, String> = HashMap::new();
    let mut laid_out = Vec::new();
    for (index, def) in indexed("ss") {
        let place = if def == EMPTY_SLOT {
            format!("empty[{}]", laid_out.len())
        } else {
            laid_out.push(def.clone());
            format!("frame[{}]", laid_out.len() - 1)
        };
        slot_place.insert(format!("ss{index}"), place);
    }
    body.push_str(&format!("frame {laid_out:?}\n"));
    for (index, def) in indexed("dss") {
        body.push_str(&format!("dynamic slot {def}\n"));
        slot_place.insert(format!("dss{index}"), format!("dynamic[{index}]"));
    }
    // `func_addr` by which declaration, too.
    let func_addr = Regex::new(r"(func_addr\.\w+ )fn(\d+)").unwrap();
    for &i in &order {
        body.push_str(&blocks[i].0);
        body.push('\n');
        for line in &blocks[i].1 {
            body.push_str(&func_addr.replace(line, "${1}fn$2 fa$2"));
            body.push('\n');
        }
    }

    // Resolve aliases (chains too).
    let body = value_re.replace_all(&body, |c: &Captures| {
        let mut v = c[0].to_string();
        while let Some(next) = aliases.get(&v) {
            v = next.clone();
        }
        v
    });

    // Expand side-table references, then number them by first appearance.
    // Slot uses are their place in the frame.
    let slot_use = Regex::new(r"\bd?ss\d+\b").unwrap();
    let body = slot_use.replace_all(&body, |c: &Captures| {
        slot_place.get(&c[0]).cloned().unwrap_or_else(|| "?".into())
    });
    // Signatures and external functions are named by their content.
    let contents: RefCell<HashMap<String, usize>> = RefCell::default();
    let expand = |text: &str| {
        fn expand(
            text: &str,
            defs: &HashMap<String, String>,
            entity: &Regex,
            contents: &RefCell<HashMap<String, usize>>,
            depth: u32,
        ) -> String {
            entity
                .replace_all(text, |c: &Captures| {
                    let kind = &c[1];
                    let def = defs.get(&c[0]).map(|d| d.as_str()).unwrap_or("?");
                    let def = if depth > 8 {
                        def.to_string()
                    } else {
                        expand(def, defs, entity, contents, depth + 1)
                    };
                    let def = if kind == "region" {
                        // `user_id "description"`: the description is only for printing.
                        def.split_whitespace().next().unwrap_or("").to_string()
                    } else {
                        def
                    };
                    let id = if kind == "sig" || kind == "fn" {
                        let mut contents = contents.borrow_mut();
                        let next = contents.len();
                        contents
                            .entry(format!("{kind} {def}"))
                            .or_insert(next)
                            .to_string()
                    } else {
                        c[2].to_string()
                    };
                    format!("{kind}@{id}{{{def}}}")
                })
                .to_string()
        }
        expand(text, &defs, &entity, &contents, 0)
    };
    let expanded = expand(&body);
    let numbered_entity = Regex::new(r"\b(dt|gv|sig|fn|fa|const|region)@(\d+)").unwrap();
    let mut numbers: HashMap<String, usize> = HashMap::new();
    let mut counts: HashMap<String, usize> = HashMap::new();
    let expanded = numbered_entity.replace_all(&expanded, |c: &Captures| {
        let kind = c[1].to_string();
        let key = format!("{kind}{}", &c[2]);
        let next = counts.entry(kind.clone()).or_insert(0);
        let n = *numbers.entry(key).or_insert_with(|| {
            *next += 1;
            *next - 1
        });
        format!("{kind}#{n}")
    });
    // Values and blocks by first appearance.
    let mut renamed = String::new();
    let mut names: HashMap<String, String> = HashMap::new();
    let token = Regex::new(r"\b(v|block)\d+\b").unwrap();
    let mut nv = 0;
    let mut nb = 0;
    let text = token.replace_all(&expanded, |c: &Captures| {
        names
            .entry(c[0].to_string())
            .or_insert_with(|| {
                if &c[1] == "v" {
                    nv += 1;
                    format!("v#{}", nv - 1)
                } else {
                    nb += 1;
                    format!("block#{}", nb - 1)
                }
            })
            .clone()
    });
    renamed.push_str(&header);
    renamed.push('\n');
    renamed.push_str(&text);
    renamed
}
