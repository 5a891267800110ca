//! The hand-written declarations in this crate against the C header, so that they cannot drift:
//!
//!  1. the header is parsed (it is plain C99 with a fixed style): every `CHUNKSERVE_API` function,
//!     every `typedef struct`, every integer `#define CHUNKSERVE_*`, the scalar and callback
//!     typedefs; each must be declared here with the same Rust-mapped types, and vice versa;
//!  2. the C compiler's layout of every struct (printed by chunkserve_capi_layout_dump, a C program
//!     built from the header) must equal Rust's size, alignment, field offsets and field sizes.
//!
//! CHUNKSERVE_HEADER overrides the header path (default: this repository's capi/include);
//! CHUNKSERVE_LAYOUT_DUMP names the dump program. Part 2 needs it, so its test is `#[ignore]`d:
//! ctest sets the variable and runs it with `-- --include-ignored`; run that way without the
//! variable, it fails saying so.
use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use chunkserve_sys as sys;

fn header_text() -> String {
    let path = std::env::var("CHUNKSERVE_HEADER").unwrap_or_else(|_| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../../capi/include/chunkserve/chunkserve.h"
        )
        .to_string()
    });
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"))
}

fn strip_comments(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("/*") {
        out.push_str(&rest[..start]);
        let end = rest[start + 2..].find("*/").expect("unterminated comment") + start + 4;
        out.push(' ');
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// The header's C declarations, with preprocessor lines removed and whitespace collapsed.
struct Header {
    constants: BTreeMap<String, i64>,
    /// name -> (parameter types, return type), Rust-mapped.
    functions: BTreeMap<String, (Vec<String>, String)>,
    /// name -> [(field, Rust-mapped type)] in order.
    structs: BTreeMap<String, Vec<(String, String)>>,
    typedefs: BTreeMap<String, String>,
    /// Function-pointer typedefs: name -> parameter types.
    callbacks: BTreeMap<String, Vec<String>>,
}

fn canonical(rust_type: &str) -> String {
    rust_type
        .split_whitespace()
        .collect::<Vec<_>>()
        .join("")
        .replace("core::ffi::", "")
}

/// Maps a C type ("const chunkserve_engine_options_t*", "chunkserve_error_t**", "int64_t") to the
/// Rust type a declaration must use, in canonical (whitespace-free) form.
fn c_to_rust(c: &str) -> String {
    let spaced = c.replace('*', " * ");
    let tokens: Vec<&str> = spaced.split_whitespace().collect();
    let mut base_const = false;
    let mut base = "";
    let mut levels: Vec<bool> = Vec::new(); // per pointer level: is the pointer itself const
    for t in &tokens {
        match *t {
            "const" if levels.is_empty() => base_const = true,
            "const" => *levels.last_mut().unwrap() = true,
            "*" => levels.push(false),
            other => {
                assert!(
                    base.is_empty() && levels.is_empty(),
                    "cannot parse C type {c:?}"
                );
                base = other;
            }
        }
    }
    let mapped = match base {
        "int32_t" => "i32",
        "uint32_t" => "u32",
        "int64_t" => "i64",
        "uint64_t" => "u64",
        "size_t" => "usize",
        "float" => "f32",
        "double" => "f64",
        "char" => "c_char",
        "void" if levels.is_empty() => "()",
        "void" => "c_void",
        other => other,
    };
    let mut out = mapped.to_string();
    let mut pointee_const = base_const;
    for pointer_const in levels {
        out = format!("{}{}", if pointee_const { "*const" } else { "*mut" }, out);
        pointee_const = pointer_const;
    }
    canonical(&out)
}

/// Splits "const char* name" into ("const char*", "name").
fn split_declarator(decl: &str) -> (String, String) {
    let decl = decl.trim();
    let name_start = decl
        .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
        .map(|i| i + 1)
        .unwrap_or(0);
    (
        decl[..name_start].trim().to_string(),
        decl[name_start..].to_string(),
    )
}

fn parse_header() -> Header {
    let text = strip_comments(&header_text());
    let mut constants = BTreeMap::new();
    let mut code = String::new();
    for line in text.lines() {
        let line = line.trim();
        if let Some(define) = line.strip_prefix("#define ") {
            let mut parts = define.splitn(2, char::is_whitespace);
            let name = parts.next().unwrap_or("");
            let value = parts
                .next()
                .unwrap_or("")
                .trim()
                .trim_start_matches('(')
                .trim_end_matches(')');
            if name.starts_with("CHUNKSERVE_") {
                if let Ok(v) = value.trim().parse::<i64>() {
                    constants.insert(name.to_string(), v);
                }
            }
            continue;
        }
        if line.starts_with('#') || line.starts_with("extern \"C\"") || line == "}" {
            continue;
        }
        code.push_str(line);
        code.push(' ');
    }
    let code = code.split_whitespace().collect::<Vec<_>>().join(" ");

    let mut functions = BTreeMap::new();
    let mut structs = BTreeMap::new();
    let mut typedefs = BTreeMap::new();
    let mut callbacks = BTreeMap::new();
    let mut rest = code.as_str();
    while !rest.trim().is_empty() {
        let brace_first = match (rest.find('{'), rest.find(';')) {
            (Some(brace), Some(semi)) => brace < semi,
            _ => false,
        };
        let stmt_end = if rest.trim_start().starts_with("typedef struct") && brace_first {
            // A struct body holds ';' of its own: the statement ends after the closing brace.
            let close = rest.find('}').expect("unterminated struct");
            close + rest[close..].find(';').expect("struct without ';'")
        } else {
            match rest.find(';') {
                Some(i) => i,
                None => break,
            }
        };
        let stmt = rest[..stmt_end].trim();
        rest = &rest[stmt_end + 1..];
        if let Some(decl) = stmt.strip_prefix("CHUNKSERVE_API ") {
            let open = decl.find('(').expect("function without '('");
            let close = decl.rfind(')').expect("function without ')'");
            let (ret, name) = split_declarator(&decl[..open]);
            let params_text = decl[open + 1..close].trim();
            let params = if params_text == "void" {
                Vec::new()
            } else {
                params_text
                    .split(',')
                    .map(|p| c_to_rust(&split_declarator(p).0))
                    .collect()
            };
            functions.insert(name, (params, c_to_rust(&ret)));
        } else if let Some(def) = stmt.strip_prefix("typedef struct ") {
            if let Some(open) = def.find('{') {
                let close = def.rfind('}').unwrap();
                let alias = def[close + 1..].trim().to_string();
                let fields = def[open + 1..close]
                    .split(';')
                    .filter(|f| !f.trim().is_empty())
                    .map(|f| {
                        // An array field, "int32_t top_tokens[CHUNKSERVE_MAX_TOP_LOGPROBS]", is
                        // "[i32; 20]" in Rust: its length is a number or a #define.
                        let f = f.trim();
                        if let (Some(open), true) = (f.find('['), f.ends_with(']')) {
                            let len_text = f[open + 1..f.len() - 1].trim();
                            let len = len_text
                                .parse::<i64>()
                                .ok()
                                .or_else(|| constants.get(len_text).copied());
                            let len = len.unwrap_or_else(|| {
                                panic!("array length {len_text:?} is not a number or a constant")
                            });
                            let (ty, name) = split_declarator(&f[..open]);
                            (name, canonical(&format!("[{};{len}]", c_to_rust(&ty))))
                        } else {
                            let (ty, name) = split_declarator(f);
                            (name, c_to_rust(&ty))
                        }
                    })
                    .collect();
                structs.insert(alias, fields);
            }
            // Else an opaque handle: "typedef struct chunkserve_engine chunkserve_engine_t".
        } else if let Some(def) = stmt.strip_prefix("typedef void (*") {
            let name_end = def.find(')').unwrap();
            let params = &def[name_end + 1..];
            let params = params.trim().trim_start_matches('(').trim_end_matches(')');
            let params: Vec<String> = params
                .split(',')
                .map(|p| c_to_rust(&split_declarator(p).0))
                .collect();
            callbacks.insert(def[..name_end].to_string(), params);
        } else if let Some(def) = stmt.strip_prefix("typedef ") {
            let (ty, name) = split_declarator(def);
            typedefs.insert(name, c_to_rust(&ty));
        } else {
            panic!("unrecognized declaration in the header: {stmt:?}");
        }
    }
    Header {
        constants,
        functions,
        structs,
        typedefs,
        callbacks,
    }
}

#[test]
fn header_parser_sees_the_whole_api() {
    let h = parse_header();
    assert!(
        h.functions.len() >= 20,
        "only {} functions parsed",
        h.functions.len()
    );
    assert!(h.structs.contains_key("chunkserve_engine_options_t"));
    assert_eq!(h.constants.get("CHUNKSERVE_STATUS_ABORTED"), Some(&13));
    assert_eq!(
        h.constants.get("CHUNKSERVE_STATUS_UNAUTHENTICATED"),
        Some(&14)
    );
    assert_eq!(c_to_rust("const char*"), "*constc_char");
    assert_eq!(
        c_to_rust("chunkserve_error_t**"),
        "*mut*mutchunkserve_error_t"
    );
}

#[test]
fn functions_match_the_header() {
    let h = parse_header();
    let declared: BTreeMap<String, (Vec<String>, String)> = sys::DECLARED_FUNCTIONS
        .iter()
        .map(|(name, params, ret)| {
            (
                name.to_string(),
                (
                    params.iter().map(|p| canonical(p)).collect(),
                    canonical(ret),
                ),
            )
        })
        .collect();
    let header_names: BTreeSet<_> = h.functions.keys().collect();
    let declared_names: BTreeSet<_> = declared.keys().collect();
    assert_eq!(
        header_names, declared_names,
        "function sets differ (header vs chunkserve-sys)"
    );
    for (name, want) in &h.functions {
        assert_eq!(
            &declared[name], want,
            "signature of {name}: (params, return)"
        );
    }
}

#[test]
fn structs_match_the_header() {
    let h = parse_header();
    let declared: BTreeMap<&str, &sys::StructLayout> =
        sys::DECLARED_STRUCTS.iter().map(|s| (s.name, *s)).collect();
    let header_names: BTreeSet<&str> = h.structs.keys().map(|s| s.as_str()).collect();
    let declared_names: BTreeSet<&str> = declared.keys().copied().collect();
    assert_eq!(
        header_names, declared_names,
        "struct sets differ (header vs chunkserve-sys)"
    );
    for (name, fields) in &h.structs {
        let rust: Vec<(String, String)> = declared[name.as_str()]
            .fields
            .iter()
            .map(|f| (f.name.to_string(), canonical(f.ty)))
            .collect();
        assert_eq!(&rust, fields, "fields of {name}: (name, type) in order");
    }
}

#[test]
fn constants_and_typedefs_match_the_header() {
    let h = parse_header();
    let declared: BTreeMap<String, i64> = sys::DECLARED_CONSTANTS
        .iter()
        .map(|(n, v)| (n.to_string(), *v))
        .collect();
    assert_eq!(
        h.constants, declared,
        "integer #defines (header vs chunkserve-sys)"
    );
    let typedefs: BTreeMap<String, String> = sys::DECLARED_TYPEDEFS
        .iter()
        .map(|(n, t)| (n.to_string(), canonical(t)))
        .collect();
    assert_eq!(h.typedefs, typedefs, "scalar typedefs");
    let callbacks: BTreeMap<String, Vec<String>> = sys::CALLBACKS
        .iter()
        .map(|(n, params)| (n.to_string(), params.iter().map(|p| canonical(p)).collect()))
        .collect();
    assert_eq!(
        h.callbacks, callbacks,
        "callback typedefs and their parameters"
    );
}

#[test]
#[ignore = "needs CHUNKSERVE_LAYOUT_DUMP (ctest sets it)"]
fn layouts_match_the_c_compiler() {
    let dump = match std::env::var("CHUNKSERVE_LAYOUT_DUMP") {
        Ok(dump) if !dump.is_empty() => dump,
        _ => panic!(
            "CHUNKSERVE_LAYOUT_DUMP is not set, and this test needs it: set it to the path of \
             chunkserve_capi_layout_dump (e.g. CHUNKSERVE_LAYOUT_DUMP=<build>/bin/\
             chunkserve_capi_layout_dump; ctest sets it), or run without --ignored / \
             --include-ignored to skip it"
        ),
    };
    let out = Command::new(&dump)
        .output()
        .unwrap_or_else(|e| panic!("running {dump}: {e}"));
    assert!(out.status.success(), "{dump} failed");
    let text = String::from_utf8(out.stdout).unwrap();
    let declared: BTreeMap<&str, &sys::StructLayout> =
        sys::DECLARED_STRUCTS.iter().map(|s| (s.name, *s)).collect();
    let mut c_fields: BTreeMap<String, Vec<(String, usize, usize)>> = BTreeMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.as_slice() {
            ["struct", name, size, align] => {
                let s = declared
                    .get(name)
                    .unwrap_or_else(|| panic!("{name} not declared in Rust"));
                assert_eq!(s.size, size.parse::<usize>().unwrap(), "sizeof({name})");
                assert_eq!(s.align, align.parse::<usize>().unwrap(), "alignof({name})");
                c_fields.insert(name.to_string(), Vec::new());
            }
            ["field", name, field, offset, size] => {
                c_fields
                    .get_mut(*name)
                    .expect("field before its struct")
                    .push((
                        field.to_string(),
                        offset.parse().unwrap(),
                        size.parse().unwrap(),
                    ));
            }
            _ => panic!("unexpected layout line {line:?}"),
        }
    }
    let c_names: BTreeSet<&str> = c_fields.keys().map(|s| s.as_str()).collect();
    let rust_names: BTreeSet<&str> = declared.keys().copied().collect();
    assert_eq!(
        c_names, rust_names,
        "structs in the layout dump vs chunkserve-sys"
    );
    for (name, fields) in &c_fields {
        let rust: Vec<(String, usize, usize)> = declared[name.as_str()]
            .fields
            .iter()
            .map(|f| (f.name.to_string(), f.offset, f.size))
            .collect();
        assert_eq!(&rust, fields, "layout of {name}: (field, offset, size)");
    }
}
