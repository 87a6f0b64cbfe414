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
        for p in use_paths(&item.tree) {
            if let Some(first) = p.first() {
                self.note(first, p.get(1).map(String::as_str));
            }
        }
    }

    // Doc comments and other attributes name modules in prose, not in code.
    fn visit_attribute(&mut self, _: &'ast syn::Attribute) {}
}

/// The paths a `use` tree brings in, each as its segments (a glob's as its prefix).
fn use_paths(tree: &syn::UseTree) -> Vec<Vec<String>> {
    fn walk(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                walk(&p.tree, prefix, out);
                prefix.pop();
            }
            syn::UseTree::Name(n) => out.push([prefix.clone(), vec![n.ident.to_string()]].concat()),
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
    walk(tree, &mut Vec::new(), &mut paths);
    paths
}

/// Paths (in code and `use` trees) that name a module inside `store`, such as
/// `store::accounts::user_by_name`: calls of storage functions. Row types (`store::IncidentRow`)
/// and the `Store` handle are not modules and do not count.
struct StorageCalls {
    found: BTreeSet<String>,
}

fn names_storage_module(segments: &[String]) -> Option<String> {
    let lowercase = |s: &String| s.chars().next().is_some_and(|c| c.is_ascii_lowercase());
    let at = segments.iter().position(|s| s == "store")?;
    // A storage module, or a function in one; a type in one (`store::alerts::IncidentRow`) is
    // a row, which every layer may hold.
    (lowercase(segments.get(at + 1)?) && segments.get(at + 2).is_none_or(lowercase))
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
    assert!(names_storage_module(&path("crate::store::alerts::IncidentRow")).is_none());
    assert!(names_storage_module(&path("store::alerts::IncidentRow::default")).is_none());
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

/// The server's folders (`http/`, `store/`, `billing/`, …), each with its parts: every file or
/// subfolder directly in it but its `mod.rs`, which declares the parts and may name any of them.
fn server_folders() -> Vec<PathBuf> {
    let mut folders = Vec::new();
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("directory entry").path();
            if path.is_dir() && path.file_name().is_some_and(|n| n != "tests") {
                out.push(path.clone());
                walk(&path, out);
            }
        }
    }
    walk(Path::new(SERVER_SRC), &mut folders);
    folders.sort();
    folders
}

/// The module path of a source file: `http/review/rows.rs` is `crate::http::review::rows`, a
/// folder's `mod.rs` the folder's, `lib.rs` the crate.
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).expect("under src");
    let mut path = vec!["crate".to_owned()];
    for c in rel.components() {
        let c = c.as_os_str().to_string_lossy();
        let name = c.trim_end_matches(".rs");
        if name != "mod" && name != "lib" {
            path.push(name.to_owned());
        }
    }
    path
}

/// Every path a file's code (not its tests) names, made absolute where it starts with `crate`,
/// `super` or `self`; other paths (external crates, names a `use` brought in) are left out:
/// the `use` that brought a name in is itself counted.
struct AbsolutePaths {
    module: Vec<String>,
    found: BTreeSet<Vec<String>>,
}

impl AbsolutePaths {
    fn note(&mut self, segments: &[String]) {
        let mut at = match segments.first().map(String::as_str) {
            Some("crate") => vec!["crate".to_owned()],
            Some("self") => self.module.clone(),
            Some("super") => self.module.clone(),
            _ => return,
        };
        let mut rest = &segments[1..];
        if segments[0] == "super" {
            at.pop();
            while rest.first().is_some_and(|s| s == "super") {
                at.pop();
                rest = &rest[1..];
            }
        }
        at.extend(rest.iter().cloned());
        self.found.insert(at);
    }
}

impl<'ast> Visit<'ast> for AbsolutePaths {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if !is_test_only_item(item) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        self.note(&segments);
        syn::visit::visit_path(self, path);
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        for p in use_paths(&item.tree) {
            self.note(&p);
        }
    }

    fn visit_attribute(&mut self, _: &'ast syn::Attribute) {}
}

/// One folder's parts → the parts of the same folder their code names.
fn folder_graph(folder: &Path) -> Graph {
    let src = Path::new(SERVER_SRC);
    let prefix = module_path(src, &folder.join("mod.rs"));
    let mut files = Vec::new();
    rust_files(folder, &mut files);
    let part = |file: &Path| -> Option<String> {
        let rel = file.strip_prefix(folder).expect("under the folder");
        let first = rel.components().next()?.as_os_str().to_string_lossy();
        let name = first.trim_end_matches(".rs").to_owned();
        (name != "mod").then_some(name)
    };
    let parts: BTreeSet<String> = files.iter().filter_map(|f| part(f)).collect();
    let mut graph = Graph::new();
    for file in &files {
        let name = file.file_name().expect("a name").to_string_lossy();
        let rel = file.strip_prefix(folder).expect("under the folder");
        if name == "tests.rs"
            || name.ends_with("_tests.rs")
            || rel.components().any(|c| c.as_os_str() == "tests")
        {
            continue;
        }
        let Some(own) = part(file) else { continue };
        let text = std::fs::read_to_string(file).expect("read source");
        let parsed =
            syn::parse_file(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", file.display()));
        let mut paths = AbsolutePaths {
            module: module_path(src, file),
            found: BTreeSet::new(),
        };
        paths.visit_file(&parsed);
        let named: Vec<String> = (paths.found.iter())
            .filter_map(|p| {
                let next = p.strip_prefix(prefix.as_slice())?.first()?;
                (parts.contains(next) && *next != own).then(|| next.clone())
            })
            .collect();
        graph.entry(own).or_default().extend(named);
    }
    graph
}

#[test]
fn every_folder_of_the_server_imports_its_parts_without_a_cycle() {
    let folders = server_folders();
    assert!(
        folders.iter().any(|f| f.ends_with("http")) && folders.iter().any(|f| f.ends_with("store")),
        "read the server's folders: {folders:?}"
    );
    let mut cycles = Vec::new();
    for folder in &folders {
        let graph = folder_graph(folder);
        let rel = folder
            .strip_prefix(SERVER_SRC)
            .expect("under src")
            .display();
        cycles.extend(
            graph
                .keys()
                .filter_map(|m| cycle_from(&graph, m))
                .map(|c| format!("{rel}/: {}", c.join(" → "))),
        );
    }
    assert!(
        cycles.is_empty(),
        "import cycles inside a folder:\n{}",
        cycles.join("\n")
    );
}

#[test]
fn a_path_inside_a_folder_is_read_from_where_it_is_written() {
    let src = Path::new(SERVER_SRC);
    let module = module_path(src, &src.join("http/review/rows.rs"));
    assert_eq!(module, ["crate", "http", "review", "rows"]);
    let mut paths = AbsolutePaths {
        module,
        found: BTreeSet::new(),
    };
    let code: syn::File = syn::parse_str(
        "use super::super::charts::Table; use super::Figure; fn f() { crate::http::page::render(); self::g(); }",
    )
    .expect("parses");
    paths.visit_file(&code);
    let found: Vec<String> = paths.found.iter().map(|p| p.join("::")).collect();
    for expected in [
        "crate::http::charts::Table",
        "crate::http::review::Figure",
        "crate::http::page::render",
        "crate::http::review::rows::g",
    ] {
        assert!(
            found.iter().any(|f| f == expected),
            "{expected} in {found:?}"
        );
    }
}

/// Lines a source file may have (its tests apart), and lines a function may have.
const FILE_LINES: usize = 800;
const FUNCTION_LINES: usize = 150;

/// What is over those budgets, by name, while it waits to be split: nothing may join this list,
/// and whatever leaves it must be taken off (the test says so). Empty: keep it so.
const OVER_BUDGET: &[&str] = &[];

/// Functions (free, in an `impl` or a trait's default) over `FUNCTION_LINES`, from `fn` to
/// their closing brace, leaving out tests.
struct LongFunctions {
    file: String,
    found: Vec<(String, usize)>,
}

impl LongFunctions {
    fn measure(&mut self, name: &syn::Ident, from: proc_macro2::Span, to: proc_macro2::Span) {
        let lines = to.end().line + 1 - from.start().line;
        if lines > FUNCTION_LINES {
            self.found.push((format!("{}::{name}", self.file), lines));
        }
    }
}

impl<'ast> Visit<'ast> for LongFunctions {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if !is_test_only_item(item) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if !f
            .attrs
            .iter()
            .any(|a| a.path().segments.last().is_some_and(|s| s.ident == "test"))
        {
            let close = f.block.brace_token.span.close();
            self.measure(&f.sig.ident, f.sig.fn_token.span, close);
        }
        syn::visit::visit_item_fn(self, f);
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        let close = f.block.brace_token.span.close();
        self.measure(&f.sig.ident, f.sig.fn_token.span, close);
        syn::visit::visit_impl_item_fn(self, f);
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if let Some(block) = &f.default {
            self.measure(
                &f.sig.ident,
                f.sig.fn_token.span,
                block.brace_token.span.close(),
            );
        }
        syn::visit::visit_trait_item_fn(self, f);
    }
}

/// A file of tests or test helpers, which the budgets leave alone.
fn is_test_file(rel: &Path) -> bool {
    let name = rel.file_name().expect("a name").to_string_lossy();
    name == "tests.rs"
        || name.ends_with("_tests.rs")
        || name == "test_support.rs"
        || rel.components().any(|c| c.as_os_str() == "tests")
}

/// Every source file of the workspace's crates and benchmarks, outside tests, over its budget;
/// and every function over its own.
fn over_budget() -> BTreeMap<String, usize> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut over = BTreeMap::new();
    for dir in [
        "core/src",
        "proto/src",
        "server/src",
        "agent/src",
        "fake-nvml/src",
        "benches",
    ] {
        let mut files = Vec::new();
        rust_files(&root.join(dir), &mut files);
        for file in files {
            let rel = file.strip_prefix(root).expect("under the root");
            if is_test_file(rel) {
                continue;
            }
            let name = rel.display().to_string();
            let text = std::fs::read_to_string(&file).expect("read source");
            let lines = text.lines().count();
            if lines > FILE_LINES {
                over.insert(name.clone(), lines);
            }
            let parsed = syn::parse_file(&text)
                .unwrap_or_else(|e| panic!("parsing {}: {e}", file.display()));
            let mut long = LongFunctions {
                file: name,
                found: Vec::new(),
            };
            long.visit_file(&parsed);
            over.extend(long.found);
        }
    }
    over
}

#[test]
fn no_source_file_over_800_lines_and_no_function_over_150() {
    let over = over_budget();
    let new: Vec<String> = over
        .iter()
        .filter(|(name, _)| !OVER_BUDGET.contains(&name.as_str()))
        .map(|(name, lines)| format!("{name}: {lines} lines"))
        .collect();
    let paid: Vec<&&str> = OVER_BUDGET
        .iter()
        .filter(|name| !over.contains_key(**name))
        .collect();
    assert!(
        new.is_empty(),
        "over budget (a file {FILE_LINES} lines, a function {FUNCTION_LINES}): split it\n{}",
        new.join("\n")
    );
    assert!(
        paid.is_empty(),
        "within budget now: take these off OVER_BUDGET in tests/architecture.rs: {paid:?}"
    );
}

#[test]
fn a_long_function_is_measured_from_fn_to_its_closing_brace() {
    let body = "    let x = 1;\n".repeat(FUNCTION_LINES);
    let code = format!(
        "/// Doc.\nfn long() {{\n{body}}}\nfn short() {{}}\n#[cfg(test)]\nmod tests {{ fn long_test() {{\n{body}}} }}\nimpl A {{ fn method() {{\n{body}}} }}"
    );
    let parsed: syn::File = syn::parse_str(&code).expect("parses");
    let mut long = LongFunctions {
        file: "f.rs".into(),
        found: Vec::new(),
    };
    long.visit_file(&parsed);
    assert_eq!(
        long.found,
        [
            ("f.rs::long".to_owned(), FUNCTION_LINES + 2),
            ("f.rs::method".to_owned(), FUNCTION_LINES + 2)
        ]
    );
}

/// The modules of `store` (its files and folders): a path naming one of them
/// (`store::tokens::list_tokens`) calls storage, where `store::connect` (opening the database)
/// and row types (`store::Replaces`) do not.
fn storage_modules() -> BTreeSet<String> {
    let dir = Path::new(SERVER_SRC).join("store");
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    entries
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.file_name().is_some_and(|n| n != "mod.rs" && n != "tests"))
        .map(|p| {
            p.file_stem()
                .expect("a name")
                .to_string_lossy()
                .into_owned()
        })
        .collect()
}

/// The paths in `file`'s code (not its tests) that name a module of `store`.
fn storage_calls_in(file: &Path, modules: &BTreeSet<String>) -> Vec<String> {
    let text = std::fs::read_to_string(file).expect("read source");
    let parsed =
        syn::parse_file(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", file.display()));
    let mut visitor = StorageCalls {
        found: BTreeSet::new(),
    };
    visitor.visit_file(&parsed);
    visitor
        .found
        .into_iter()
        .filter(|path| {
            let segments: Vec<&str> = path.split("::").collect();
            segments
                .iter()
                .position(|s| *s == "store")
                .and_then(|at| segments.get(at + 1))
                .is_some_and(|m| modules.contains(*m))
        })
        .map(|path| format!("{}: {path}", file.display()))
        .collect()
}

/// `main.rs` parses and dispatches; each command (`cli/`) calls the application layer, as the
/// pages do, and storage only to open the database.
#[test]
fn the_command_line_calls_the_application_layer_never_storage() {
    let modules = storage_modules();
    assert!(
        modules.contains("tokens") && modules.contains("accounts"),
        "read storage's modules: {modules:?}"
    );
    let src = Path::new(SERVER_SRC);
    let mut files = vec![src.join("main.rs")];
    rust_files(&src.join("cli"), &mut files);
    assert!(
        files.len() > 5,
        "read the command line's modules: {files:?}"
    );
    let calls: Vec<String> = files
        .iter()
        .flat_map(|f| storage_calls_in(f, &modules))
        .collect();
    assert!(
        calls.is_empty(),
        "the command line calling storage directly (call an application module instead):\n{}",
        calls.join("\n")
    );
    let main = std::fs::read_to_string(src.join("main.rs")).expect("main.rs");
    assert!(
        main.lines().count() < 40,
        "main.rs parses and dispatches; the commands live in cli/"
    );
}

/// The `pub use` items of a file that give something a second path: anything but an item of a
/// private module declared in the same file (`mod sqlite; pub use sqlite::SqliteStore;`) or a
/// macro handed on by name (`pub(crate) use from_columns;`).
fn second_paths(text: &str) -> Vec<String> {
    let parsed = syn::parse_file(text).unwrap_or_else(|e| panic!("parsing: {e}"));
    let private_modules: BTreeSet<String> = parsed
        .items
        .iter()
        .filter_map(|item| match item {
            syn::Item::Mod(m) if matches!(m.vis, syn::Visibility::Inherited) => {
                Some(m.ident.to_string())
            }
            _ => None,
        })
        .collect();
    let mut found = Vec::new();
    for item in &parsed.items {
        let syn::Item::Use(u) = item else { continue };
        if matches!(u.vis, syn::Visibility::Inherited) || is_test_only(&u.attrs) {
            continue;
        }
        for path in use_paths(&u.tree) {
            let handed_on = path.len() == 1
                || path
                    .first()
                    .is_some_and(|first| private_modules.contains(first));
            if !handed_on {
                found.push(path.join("::"));
            }
        }
    }
    found
}

/// One path per type: the server hands on nothing under a second name (no `pub use` of the
/// core's types, of another module's or of a public submodule's), so a reader finds each type
/// where it is written, and the compiler, not a re-export chain, says where that is.
#[test]
fn every_type_has_one_path() {
    let src = Path::new(SERVER_SRC);
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut found = Vec::new();
    for file in files {
        let rel = file.strip_prefix(src).expect("under src");
        if is_test_file(rel) {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("read source");
        for path in second_paths(&text) {
            found.push(format!("{}: pub use {path}", rel.display()));
        }
    }
    assert!(
        found.is_empty(),
        "re-exported under a second path (name the item where it is written):\n{}",
        found.join("\n")
    );
}

#[test]
fn a_second_path_is_told_from_a_private_modules_item() {
    let found = second_paths(
        "mod sqlite;\npub mod alerts;\nmacro_rules! m { () => {} }\n\
         pub use sqlite::SqliteStore;\npub(crate) use m;\nuse gpuledger_core::scope::Scope;\n\
         pub use alerts::IncidentRow;\npub use gpuledger_core::owners::OwnerSchema;\n\
         pub(crate) use crate::config::{self, Config};",
    );
    assert_eq!(
        found,
        [
            "alerts::IncidentRow",
            "gpuledger_core::owners::OwnerSchema",
            "crate::config::self",
            "crate::config::Config"
        ]
    );
}

/// Each package of a `cargo tree` with its features (`name vX.Y.Z|feature,feature`), one
/// line per way it is built (for the target, for build scripts and procedural macros).
fn features_built(args: &[&str]) -> BTreeMap<String, BTreeSet<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["tree", "--locked", "--prefix", "none", "-f", "{p}|{f}"])
        .args(args)
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "cargo tree {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut built: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let line = line.trim_end_matches(" (*)");
        if let Some((package, features)) = line.split_once('|') {
            let package = package.trim_end_matches(" (proc-macro)").to_owned();
            built
                .entry(package)
                .or_default()
                .insert(features.to_owned());
        }
    }
    built
}

/// The packages the server alone is built with (`cargo run -p gpuledger-server`, the README's
/// first command) that the test build (`scripts/test`) builds with other features: each
/// would be compiled twice, the second time after the tests.
fn built_twice(alone: &[&str], tests: &[&str]) -> Vec<String> {
    let (alone, tests) = (features_built(alone), features_built(tests));
    alone
        .iter()
        .filter_map(|(package, features)| {
            let with_tests = tests.get(package).cloned().unwrap_or_default();
            let missing: Vec<&String> = features.difference(&with_tests).collect();
            (!missing.is_empty())
                .then(|| format!("{package}: alone {missing:?}, in the tests {with_tests:?}"))
        })
        .collect()
}

/// The README's first command after its test command reuses every build of the tests: the
/// workspace hack turns on, for the server alone, each dependency feature the tests turn on.
#[test]
fn the_server_alone_is_built_with_the_test_builds_dependencies() {
    let differ = built_twice(
        &["-p", "gpuledger-server", "-e", "normal,build"],
        &["--workspace", "-e", "normal,build,dev"],
    );
    assert!(
        differ.is_empty(),
        "built a second time by `cargo run -p gpuledger-server` after the tests (add the features \
         to workspace-hack/Cargo.toml, [build-dependencies] for a host-side one):\n{}",
        differ.join("\n")
    );
}

/// And the check finds a difference where there is one: the agent alone is built without the
/// features the server's dependencies add.
#[test]
fn a_dependency_built_twice_is_found() {
    let differ = built_twice(
        &["-p", "gpuledger-agent", "-e", "normal,build"],
        &["--workspace", "-e", "normal,build,dev"],
    );
    assert!(!differ.is_empty(), "the agent alone shares every build");
}
