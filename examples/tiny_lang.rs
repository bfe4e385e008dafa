//! A tiny language runtime that JIT-compiles through jitfold.
//!
//! The language: integer functions of one or more arguments, with `+ - * <`,
//! calls, `if c then a else b`, literals and parameters. Programs written by
//! different people (or generated per call site) often contain the same
//! function under another name; jitfold compiles it once. The runtime's code
//! generator is written against `cranelift_module::Module` and knows nothing
//! about jitfold: only the module's type changes.
//!
//! Run with `cargo run --example tiny_lang`.

use cranelift_codegen::ir::{AbiParam, InstBuilder, Value, condcodes::IntCC, types::I64};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{FuncId, Linkage, Module, default_libcall_names};
use jitfold::{DedupModule, DedupOptions};
use std::collections::HashMap;

const PROGRAM: &str = "
    fn add3(x) = x + 3
    fn square(x) = x * x
    fn plus_three(y) = y + 3
    fn poly(x) = square(x) + add3(x)
    fn poly_again(v) = square(v) + plus_three(v)
    fn max(a, b) = if a < b then b else a
    fn bigger(p, q) = if p < q then q else p
    fn fact(n) = if n < 2 then 1 else n * fact(n - 1)
    fn clamp10(x) = max(0, if 10 < x then 10 else x)
";

#[derive(Debug, Clone)]
enum Expr {
    Num(i64),
    Var(usize),
    Bin(char, Box<Expr>, Box<Expr>),
    Call(String, Vec<Expr>),
    If(Box<Expr>, Box<Expr>, Box<Expr>),
}

struct FnDef {
    name: String,
    params: Vec<String>,
    body: Expr,
}

/// A small recursive-descent parser over whitespace-separated tokens.
struct Parser<'a> {
    tokens: Vec<&'a str>,
    pos: usize,
    params: Vec<String>,
}

impl<'a> Parser<'a> {
    fn peek(&self) -> &'a str {
        self.tokens.get(self.pos).copied().unwrap_or("")
    }
    fn next(&mut self) -> &'a str {
        let t = self.peek();
        self.pos += 1;
        t
    }
    fn expect(&mut self, t: &str) -> Result<(), String> {
        match self.next() {
            got if got == t => Ok(()),
            got => Err(format!("expected `{t}`, found `{got}`")),
        }
    }
    fn function(&mut self) -> Result<FnDef, String> {
        self.expect("fn")?;
        let name = self.next().to_string();
        self.expect("(")?;
        self.params.clear();
        while self.peek() != ")" {
            let param = self.next().to_string();
            self.params.push(param);
            if self.peek() == "," {
                self.next();
            }
        }
        self.expect(")")?;
        self.expect("=")?;
        let body = self.expr()?;
        Ok(FnDef {
            name,
            params: self.params.clone(),
            body,
        })
    }
    fn expr(&mut self) -> Result<Expr, String> {
        if self.peek() == "if" {
            self.next();
            let c = self.expr()?;
            self.expect("then")?;
            let a = self.expr()?;
            self.expect("else")?;
            let b = self.expr()?;
            return Ok(Expr::If(Box::new(c), Box::new(a), Box::new(b)));
        }
        let mut lhs = self.sum()?;
        if self.peek() == "<" {
            self.next();
            lhs = Expr::Bin('<', Box::new(lhs), Box::new(self.sum()?));
        }
        Ok(lhs)
    }
    fn sum(&mut self) -> Result<Expr, String> {
        let mut lhs = self.product()?;
        while matches!(self.peek(), "+" | "-") {
            let op = self.next().chars().next().unwrap();
            lhs = Expr::Bin(op, Box::new(lhs), Box::new(self.product()?));
        }
        Ok(lhs)
    }
    fn product(&mut self) -> Result<Expr, String> {
        let mut lhs = self.atom()?;
        while self.peek() == "*" {
            self.next();
            lhs = Expr::Bin('*', Box::new(lhs), Box::new(self.atom()?));
        }
        Ok(lhs)
    }
    fn atom(&mut self) -> Result<Expr, String> {
        let t = self.next();
        if t == "(" {
            let e = self.expr()?;
            self.expect(")")?;
            return Ok(e);
        }
        if let Ok(n) = t.parse() {
            return Ok(Expr::Num(n));
        }
        if let Some(i) = self.params.iter().position(|p| p == t) {
            return Ok(Expr::Var(i));
        }
        if self.peek() == "(" {
            self.next();
            let mut args = Vec::new();
            while self.peek() != ")" {
                args.push(self.expr()?);
                if self.peek() == "," {
                    self.next();
                }
            }
            self.expect(")")?;
            return Ok(Expr::Call(t.to_string(), args));
        }
        Err(format!("unknown name `{t}`"))
    }
}

fn parse(source: &str) -> Result<Vec<FnDef>, String> {
    let spaced = ["(", ")", ",", "+", "-", "*", "<", "="]
        .iter()
        .fold(source.to_string(), |s, p| s.replace(p, &format!(" {p} ")));
    let mut parser = Parser {
        tokens: spaced.split_whitespace().collect(),
        pos: 0,
        params: Vec::new(),
    };
    let mut defs = Vec::new();
    while parser.pos < parser.tokens.len() {
        defs.push(parser.function()?);
    }
    Ok(defs)
}

/// The runtime's code generator: any `Module` will do.
fn compile<M: Module>(module: &mut M, defs: &[FnDef]) -> Result<HashMap<String, FuncId>, String> {
    let mut ids = HashMap::new();
    for def in defs {
        let mut sig = module.make_signature();
        sig.params
            .extend(def.params.iter().map(|_| AbiParam::new(I64)));
        sig.returns.push(AbiParam::new(I64));
        let id = module
            .declare_function(&def.name, Linkage::Local, &sig)
            .map_err(|e| e.to_string())?;
        ids.insert(def.name.clone(), id);
    }
    let mut fctx = FunctionBuilderContext::new();
    for def in defs {
        let id = ids[&def.name];
        let mut ctx = module.make_context();
        ctx.func.signature = module
            .declarations()
            .get_function_decl(id)
            .signature
            .clone();
        let mut b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
        let entry = b.create_block();
        b.append_block_params_for_function_params(entry);
        b.switch_to_block(entry);
        let params = b.block_params(entry).to_vec();
        let result = emit(&mut b, module, &ids, &params, &def.body)?;
        b.ins().return_(&[result]);
        b.seal_all_blocks();
        b.finalize(module.target_config());
        module
            .define_function(id, &mut ctx)
            .map_err(|e| e.to_string())?;
    }
    Ok(ids)
}

fn emit<M: Module>(
    b: &mut FunctionBuilder,
    module: &mut M,
    ids: &HashMap<String, FuncId>,
    params: &[Value],
    e: &Expr,
) -> Result<Value, String> {
    Ok(match e {
        Expr::Num(n) => b.ins().iconst(I64, *n),
        Expr::Var(i) => params[*i],
        Expr::Bin(op, l, r) => {
            let (l, r) = (
                emit(b, module, ids, params, l)?,
                emit(b, module, ids, params, r)?,
            );
            match op {
                '+' => b.ins().iadd(l, r),
                '-' => b.ins().isub(l, r),
                '*' => b.ins().imul(l, r),
                _ => {
                    let c = b.ins().icmp(IntCC::SignedLessThan, l, r);
                    b.ins().uextend(I64, c)
                }
            }
        }
        Expr::Call(name, args) => {
            let id = *ids.get(name).ok_or(format!("unknown function `{name}`"))?;
            let args = args
                .iter()
                .map(|a| emit(b, module, ids, params, a))
                .collect::<Result<Vec<_>, _>>()?;
            let callee = module.declare_func_in_func(id, b.func);
            let call = b.ins().call(callee, &args);
            b.inst_results(call)[0]
        }
        Expr::If(c, t, f) => {
            let c = emit(b, module, ids, params, c)?;
            let (then_block, else_block, join) =
                (b.create_block(), b.create_block(), b.create_block());
            b.append_block_param(join, I64);
            b.ins().brif(c, then_block, &[], else_block, &[]);
            b.switch_to_block(then_block);
            let t = emit(b, module, ids, params, t)?;
            b.ins().jump(join, &[t.into()]);
            b.switch_to_block(else_block);
            let f = emit(b, module, ids, params, f)?;
            b.ins().jump(join, &[f.into()]);
            b.switch_to_block(join);
            b.block_params(join)[0]
        }
    })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let defs = parse(PROGRAM)?;
    let jit = JITModule::new(JITBuilder::new(default_libcall_names())?);
    // Batch mode: everything is grouped at finalize, so `poly_again` (which
    // calls the twin `plus_three`) merges into `poly` as well.
    let mut module = DedupModule::wrap(jit, DedupOptions::batch());
    let ids = compile(&mut module, &defs)?;
    module.finalize_definitions()?;

    for def in &defs {
        let code = module.get_finalized_function(ids[&def.name]);
        let canonical = module.canonical(ids[&def.name]).unwrap();
        let shared = if canonical == ids[&def.name] {
            String::new()
        } else {
            format!(
                "  (same code as {})",
                module
                    .declarations()
                    .get_function_decl(canonical)
                    .linkage_name(canonical)
            )
        };
        // SAFETY: every function takes `params.len()` i64s and returns an
        // i64 in the host's default calling convention; it is finalized.
        let value = unsafe {
            match def.params.len() {
                1 => std::mem::transmute::<*const u8, extern "C" fn(i64) -> i64>(code)(7),
                2 => std::mem::transmute::<*const u8, extern "C" fn(i64, i64) -> i64>(code)(7, 12),
                n => return Err(format!("{n} parameters not supported by this demo").into()),
            }
        };
        println!(
            "{:>12}(7{}) = {value}{shared}",
            def.name,
            if def.params.len() == 2 { ", 12" } else { "" }
        );
    }
    println!("\n{}", module.stats());
    Ok(())
}
