//! The house stays easy to change: no function in the workspace's source
//! (`src/`, `workers/src/`, `batchonce-apalis/src/`) is longer than
//! [`MAX_LINES`] lines, counted from its `fn` line to its closing brace. The
//! test parses every file with `syn`, so free functions, methods, trait
//! default methods and functions nested in others are all measured, and a
//! failure lists each one that is too long with its file, line and length.

use std::path::{Path, PathBuf};

use syn::spanned::Spanned;
use syn::visit::Visit;

/// The longest a function may be. A longer one is split into named steps
/// (a struct holding the state they share when many locals travel together).
const MAX_LINES: usize = 150;

/// The source folders the rule covers, from the workspace's root.
const ROOTS: &[&str] = &["src", "workers/src", "batchonce-apalis/src"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// One function's name, first line and length in lines.
struct Measured {
    name: String,
    line: usize,
    lines: usize,
}

/// Collects every function with a body in a file, nested ones included.
#[derive(Default)]
struct Functions {
    found: Vec<Measured>,
}

impl Functions {
    fn measure(&mut self, sig: &syn::Signature, body: &syn::Block) {
        let first = sig.fn_token.span().start().line;
        let last = body.brace_token.span.close().end().line;
        self.found.push(Measured {
            name: sig.ident.to_string(),
            line: first,
            lines: last + 1 - first,
        });
    }
}

impl<'ast> Visit<'ast> for Functions {
    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        self.measure(&f.sig, &f.block);
        syn::visit::visit_item_fn(self, f);
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        self.measure(&f.sig, &f.block);
        syn::visit::visit_impl_item_fn(self, f);
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if let Some(body) = &f.default {
            self.measure(&f.sig, body);
        }
        syn::visit::visit_trait_item_fn(self, f);
    }
}

#[test]
fn no_function_is_longer_than_the_limit() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ROOTS {
        rust_files(&root.join(dir), &mut files);
    }
    files.sort();
    assert!(
        files.len() > 50,
        "only {} files found under {ROOTS:?}",
        files.len()
    );
    let mut too_long = Vec::new();
    let mut measured = 0;
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap();
        let file = syn::parse_file(&text)
            .unwrap_or_else(|e| panic!("{} does not parse: {e}", path.display()));
        let mut functions = Functions::default();
        functions.visit_file(&file);
        measured += functions.found.len();
        let rel = path.strip_prefix(root).unwrap_or(path);
        for f in functions.found {
            // A span without locations reads as line 0; then nothing
            // would ever be too long.
            assert!(f.line > 0, "no line numbers: proc-macro2's span-locations");
            if f.lines > MAX_LINES {
                too_long.push(format!(
                    "{}:{}: fn {} is {} lines",
                    rel.display(),
                    f.line,
                    f.name,
                    f.lines
                ));
            }
        }
    }
    assert!(measured > 500, "only {measured} functions found");
    assert!(
        too_long.is_empty(),
        "{} functions are longer than {MAX_LINES} lines (split each into named steps):\n{}",
        too_long.len(),
        too_long.join("\n")
    );
}
