//! The independent oracle: a canonical *text* of a function, built from
//! Cranelift's printer alone, without the fingerprint encoder.
//!
//! Rule: print the function; drop its name, source locations and comments;
//! resolve value aliases; keep the blocks reachable from the entry in DFS
//! pre-order (destinations read from each block's last line, in order);
//! replace every side-table reference by its (recursively expanded)
//! definition, tagged with its first-appearance number (constants by value
//! only); list unused stack slots (but for the parser's empty placeholders)
//! as a sorted multiset; finally rename values
//! and blocks by first appearance. Two valid functions should have equal
//! fingerprints exactly when this text is equal.

use cranelift_codegen::ir::Function;
use regex::{Captures, Regex};
use std::collections::{HashMap, HashSet};

pub fn canonical_text(func: &Function) -> String {
    let printed = func.display().to_string();
    let entity = Regex::new(r"\b(ss|dss|dt|gv|sig|fn|const|region)(\d+)\b").unwrap();
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
    for &i in &order {
        body.push_str(&blocks[i].0);
        body.push('\n');
        for line in &blocks[i].1 {
            body.push_str(line);
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
    fn expand(text: &str, defs: &HashMap<String, String>, entity: &Regex, depth: u32) -> String {
        entity
            .replace_all(text, |c: &Captures| {
                let kind = &c[1];
                let def = defs.get(&c[0]).map(|d| d.as_str()).unwrap_or("?");
                let def = if depth > 8 {
                    def.to_string()
                } else {
                    expand(def, defs, entity, depth + 1)
                };
                let def = if kind == "region" {
                    // `user_id "description"`: the description is only for printing.
                    def.split_whitespace().next().unwrap_or("").to_string()
                } else {
                    def
                };
                format!("{kind}@{}{{{def}}}", &c[2])
            })
            .to_string()
    }
    let expanded = expand(&body, &defs, &entity, 0);
    let numbered_entity = Regex::new(r"\b(ss|dss|dt|gv|sig|fn|const|region)@(\d+)").unwrap();
    let mut numbers: HashMap<String, usize> = HashMap::new();
    let mut used_slots = HashSet::new();
    let mut counts: HashMap<String, usize> = HashMap::new();
    let expanded = numbered_entity.replace_all(&expanded, |c: &Captures| {
        let kind = c[1].to_string();
        if kind == "const" {
            return "const".to_string(); // By value only.
        }
        if kind == "ss" {
            used_slots.insert(format!("ss{}", &c[2]));
        }
        let key = format!("{kind}{}", &c[2]);
        let next = counts.entry(kind.clone()).or_insert(0);
        let n = *numbers.entry(key).or_insert_with(|| {
            *next += 1;
            *next - 1
        });
        format!("{kind}#{n}")
    });
    // Unused stack slots (but the parser's empty placeholders), as a sorted
    // multiset.
    let mut unused: Vec<&String> = defs
        .iter()
        .filter(|(name, def)| {
            name.starts_with("ss")
                && !used_slots.contains(*name)
                && def.as_str() != "explicit_slot 0"
        })
        .map(|(_, def)| def)
        .collect();
    unused.sort();

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
    renamed.push_str(&format!("unused slots: {unused:?}\n"));
    renamed
}
