//! What may import what inside the server (docs/architecture.md), checked on the source: the
//! server's top-level modules import each other without a cycle, storage sees nothing above it,
//! sessions know nothing of HTTP, and HTTP handlers call the application layer, never storage's
//! functions; the bill file parsers never name storage. The core crate needs no test: it cannot
//! name the server. CONTRIBUTING.md's recipes name only paths and items that exist.
//!
//! Every path `crate::module…` in a module's code (not in its tests) is an edge; `syn` reads
//! the source, so comments and strings do not count.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

const SERVER_SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/server/src");

/// Top-level module → the top-level modules its code names.
type Graph = BTreeMap<String, BTreeSet<String>>;

struct Names<'a> {
    modules: &'a BTreeSet<String>,
    found: BTreeSet<String>,
}

impl Names<'_> {
    fn note(&mut self, first: &str, second: Option<&str>) {
        if first == "crate" {
            if let Some(m) = second.filter(|m| self.modules.contains(*m)) {
                self.found.insert(m.to_owned());
            }
        }
    }
}

fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Meta>()
                .is_ok_and(|m| m.path().is_ident("test"))
    })
}

impl<'ast> Visit<'ast> for Names<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs: &[syn::Attribute] = match item {
            syn::Item::Mod(m) => &m.attrs,
            syn::Item::Fn(f) => &f.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Use(u) => &u.attrs,
            syn::Item::Struct(s) => &s.attrs,
            syn::Item::Const(c) => &c.attrs,
            _ => &[],
        };
        if !is_test_only(attrs) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        if let Some(first) = segments.first() {
            self.note(first, segments.get(1).map(String::as_str));
        }
        syn::visit::visit_path(self, path);
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        fn walk(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
            match tree {
                syn::UseTree::Path(p) => {
                    prefix.push(p.ident.to_string());
                    walk(&p.tree, prefix, out);
                    prefix.pop();
                }
                syn::UseTree::Name(n) => {
                    out.push([prefix.clone(), vec![n.ident.to_string()]].concat())
                }
                syn::UseTree::Rename(r) => {
                    out.push([prefix.clone(), vec![r.ident.to_string()]].concat())
                }
                syn::UseTree::Glob(_) => out.push(prefix.clone()),
                syn::UseTree::Group(g) => {
                    for t in &g.items {
                        walk(t, prefix, out);
                    }
                }
            }
        }
        let mut paths = Vec::new();
        walk(&item.tree, &mut Vec::new(), &mut paths);
        for p in paths {
            if let Some(first) = p.first() {
                self.note(first, p.get(1).map(String::as_str));
            }
        }
    }

    // Doc comments and other attributes name modules in prose, not in code.
    fn visit_attribute(&mut self, _: &'ast syn::Attribute) {}
}

/// Paths (in code and `use` trees) that name a module inside `store`, such as
/// `store::accounts::user_by_name`: calls of storage functions. Row types (`store::IncidentRow`)
/// and the `Store` handle are not modules and do not count.
struct StorageCalls {
    found: BTreeSet<String>,
}

fn names_storage_module(segments: &[String]) -> Option<String> {
    let at = segments.iter().position(|s| s == "store")?;
    let next = segments.get(at + 1)?;
    next.chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase())
        .then(|| segments.join("::"))
}

impl<'ast> Visit<'ast> for StorageCalls {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if !is_test_only_item(item) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        self.found.extend(names_storage_module(&segments));
        syn::visit::visit_path(self, path);
    }

    fn visit_use_tree(&mut self, tree: &'ast syn::UseTree) {
        fn walk(tree: &syn::UseTree, prefix: &mut Vec<String>, found: &mut BTreeSet<String>) {
            match tree {
                syn::UseTree::Path(p) => {
                    prefix.push(p.ident.to_string());
                    found.extend(names_storage_module(prefix));
                    walk(&p.tree, prefix, found);
                    prefix.pop();
                }
                syn::UseTree::Name(n) => {
                    prefix.push(n.ident.to_string());
                    found.extend(names_storage_module(prefix));
                    prefix.pop();
                }
                syn::UseTree::Rename(r) => {
                    prefix.push(r.ident.to_string());
                    found.extend(names_storage_module(prefix));
                    prefix.pop();
                }
                syn::UseTree::Glob(_) => {}
                syn::UseTree::Group(g) => {
                    for t in &g.items {
                        walk(t, prefix, found);
                    }
                }
            }
        }
        walk(tree, &mut Vec::new(), &mut self.found);
    }

    fn visit_attribute(&mut self, _: &'ast syn::Attribute) {}
}

/// A module, function or `use` that exists only in tests.
fn is_test_only_item(item: &syn::Item) -> bool {
    match item {
        syn::Item::Mod(m) => is_test_only(&m.attrs),
        syn::Item::Fn(f) => is_test_only(&f.attrs),
        syn::Item::Use(u) => is_test_only(&u.attrs),
        _ => false,
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The server's module graph, leaving out test files (`tests.rs`, `*_tests.rs`, `tests/`,
/// `test_support.rs`) and the binary's `main.rs`, which may use anything.
fn server_graph() -> Graph {
    let src = Path::new(SERVER_SRC);
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let top = |path: &Path| -> String {
        let rel = path.strip_prefix(src).expect("under src");
        let first = rel.components().next().expect("a component");
        first
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_owned()
    };
    let modules: BTreeSet<String> = files
        .iter()
        .map(|f| top(f))
        .filter(|m| m != "lib" && m != "main")
        .collect();
    let mut graph = Graph::new();
    for file in &files {
        let rel = file.strip_prefix(src).expect("under src").to_string_lossy();
        let name = file.file_name().expect("a name").to_string_lossy();
        let module = top(file);
        if module == "lib"
            || module == "main"
            || module == "test_support"
            || name == "tests.rs"
            || name.ends_with("_tests.rs")
            || rel.contains("tests/")
        {
            continue;
        }
        let text = std::fs::read_to_string(file).expect("read source");
        let parsed =
            syn::parse_file(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", file.display()));
        let mut names = Names {
            modules: &modules,
            found: BTreeSet::new(),
        };
        names.visit_file(&parsed);
        names.found.remove(&module);
        graph.entry(module).or_default().extend(names.found);
    }
    graph
}

/// A cycle through `start`, if any, as the modules along it.
fn cycle_from(graph: &Graph, start: &str) -> Option<Vec<String>> {
    fn walk(
        graph: &Graph,
        start: &str,
        at: &str,
        path: &mut Vec<String>,
        seen: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        for next in graph.get(at).into_iter().flatten() {
            if next == start {
                let mut cycle = path.clone();
                cycle.push(start.to_owned());
                return Some(cycle);
            }
            if seen.insert(next.clone()) {
                path.push(next.clone());
                if let Some(c) = walk(graph, start, next, path, seen) {
                    return Some(c);
                }
                path.pop();
            }
        }
        None
    }
    walk(
        graph,
        start,
        start,
        &mut vec![start.to_owned()],
        &mut BTreeSet::new(),
    )
}

#[test]
fn the_servers_modules_import_each_other_without_a_cycle() {
    let graph = server_graph();
    assert!(graph.len() > 20, "read the server's modules: {graph:?}");
    let cycles: Vec<String> = graph
        .keys()
        .filter_map(|m| cycle_from(&graph, m))
        .map(|c| c.join(" → "))
        .collect();
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
}

#[test]
fn storage_sees_only_the_core_and_sessions_know_nothing_of_http() {
    let graph = server_graph();
    let store: Vec<&String> = graph["store"].iter().collect();
    assert!(
        store.is_empty(),
        "storage imports {store:?}: it may import only the core and the wire types"
    );
    assert!(
        !graph["session"].contains("http"),
        "session imports http: cookies and extractors belong in http::session"
    );
}

#[test]
fn http_handlers_call_the_application_layer_never_storage() {
    let http = Path::new(SERVER_SRC).join("http");
    let mut files = Vec::new();
    rust_files(&http, &mut files);
    assert!(files.len() > 10, "read the HTTP modules: {files:?}");
    let mut calls = Vec::new();
    for file in files {
        let name = file.file_name().expect("a name").to_string_lossy();
        if name == "tests.rs" || name.ends_with("_tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("read source");
        let parsed =
            syn::parse_file(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", file.display()));
        let mut visitor = StorageCalls {
            found: BTreeSet::new(),
        };
        visitor.visit_file(&parsed);
        for path in visitor.found {
            calls.push(format!("{}: {path}", file.display()));
        }
    }
    assert!(
        calls.is_empty(),
        "HTTP code calling storage directly (call an application module instead):\n{}",
        calls.join("\n")
    );
}

#[test]
fn a_storage_call_is_told_from_a_row_type() {
    let path = |p: &str| p.split("::").map(String::from).collect::<Vec<_>>();
    assert!(names_storage_module(&path("store::accounts::session")).is_some());
    assert!(names_storage_module(&path("crate::store::tokens")).is_some());
    assert!(names_storage_module(&path("crate::store::IncidentRow")).is_none());
    assert!(names_storage_module(&path("store::Store")).is_none());
}

#[test]
fn a_cycle_is_found_where_there_is_one() {
    let graph: Graph = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec!["a"]),
    ]
    .into_iter()
    .map(|(m, to)| (m.to_owned(), to.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(
        cycle_from(&graph, "a").map(|c| c.join(" → ")),
        Some("a → b → c → a".to_owned())
    );
    assert_eq!(cycle_from(&graph, "d"), None);
}

/// Paths in code and `use` trees (not in tests) that name `store` at all.
struct NamesStore {
    found: BTreeSet<String>,
}

impl<'ast> Visit<'ast> for NamesStore {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if !is_test_only_item(item) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        if segments.iter().any(|s| s == "store") {
            self.found.insert(segments.join("::"));
        }
        syn::visit::visit_path(self, path);
    }

    fn visit_use_path(&mut self, p: &'ast syn::UsePath) {
        if p.ident == "store" {
            self.found.insert(format!("use …{}::…", p.ident));
        }
        syn::visit::visit_use_path(self, p);
    }

    fn visit_use_name(&mut self, n: &'ast syn::UseName) {
        if n.ident == "store" {
            self.found.insert(format!("use …::{}", n.ident));
        }
    }

    fn visit_attribute(&mut self, _: &'ast syn::Attribute) {}
}

/// The bill file parsers read bytes into bill lines; what is stored, and how a period is
/// replaced, is the import's to decide.
#[test]
fn bill_file_parsers_never_name_storage() {
    let mut named = Vec::new();
    for file in [
        "billing/focus.rs",
        "billing/parquet.rs",
        "billing/manifest.rs",
    ] {
        let path = Path::new(SERVER_SRC).join(file);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
        let parsed = syn::parse_file(&text).unwrap_or_else(|e| panic!("parsing {file}: {e}"));
        let mut visitor = NamesStore {
            found: BTreeSet::new(),
        };
        visitor.visit_file(&parsed);
        named.extend(visitor.found.into_iter().map(|p| format!("{file}: {p}")));
    }
    assert!(
        named.is_empty(),
        "bill parsers naming storage:\n{}",
        named.join("\n")
    );
    // The check can fail: a parser that stores what it read is found.
    let storing: syn::File = syn::parse_str(
        "use crate::store; fn f(s: &dyn crate::store::Store) { store::billing::put(s); }",
    )
    .expect("parses");
    let mut visitor = NamesStore {
        found: BTreeSet::new(),
    };
    visitor.visit_file(&storing);
    assert_eq!(visitor.found.len(), 3, "{:?}", visitor.found);
}

/// Every path (`server/src/shape.rs`) and Rust item (`sections::copy_of`, `CostLine`) that
/// CONTRIBUTING.md names in backquotes exists: a path in the repository (or beside it, for
/// `../shared`), an item as a name some source file declares or uses.
#[test]
fn the_contributing_recipes_name_what_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("CONTRIBUTING.md")).expect("CONTRIBUTING.md");
    let mut sources = String::new();
    for dir in ["core/src", "server/src", "agent/src"] {
        let mut files = Vec::new();
        rust_files(&root.join(dir), &mut files);
        for f in files {
            sources.push_str(&std::fs::read_to_string(f).expect("read source"));
            sources.push('\n');
        }
    }
    let declared = |name: &str| {
        sources.match_indices(name).any(|(at, _)| {
            let before = sources[..at].chars().next_back();
            let after = sources[at + name.len()..].chars().next();
            let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
            !word(before) && !word(after)
        })
    };
    let mut missing = Vec::new();
    let mut checked = 0;
    for (i, quoted) in text.split('`').enumerate() {
        if i % 2 == 0 || quoted.contains(' ') || quoted.is_empty() {
            continue;
        }
        let is_item = quoted
            .split("::")
            .all(|s| !s.is_empty() && s.chars().all(|c| c.is_alphanumeric() || c == '_'))
            && quoted.chars().next().is_some_and(|c| c.is_alphabetic());
        if quoted.contains('/') && !quoted.contains(':') {
            checked += 1;
            if !root.join(quoted).exists() {
                missing.push(format!("path {quoted}"));
            }
        } else if is_item {
            checked += 1;
            let mut segments = quoted.rsplit("::");
            let last = segments.next().unwrap_or_default();
            if !declared(last) || segments.any(|module| !declared(module)) {
                missing.push(format!("item {quoted}"));
            }
        }
    }
    assert!(checked > 30, "read CONTRIBUTING.md's names: {checked}");
    assert!(
        missing.is_empty(),
        "CONTRIBUTING.md names what does not exist: {missing:?}"
    );
}
