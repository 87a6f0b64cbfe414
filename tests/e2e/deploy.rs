//! The deployment files as shipped: the Kustomize overlays render (`kubectl kustomize`) and every
//! manifest validates against the Kubernetes schemas (`kubernetes-validate --strict`); every
//! setting the Dockerfile, manifests and systemd units name is one the binaries read; the
//! config and the probe the manifests give start and answer a real server; the systemd units
//! pass `systemd-analyze verify`. docs/configuration.md names exactly the flags and environment
//! variables the binaries read.

use crate::support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use support::*;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn kustomize(dir: &str) -> String {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(repo().join(dir))
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "kubectl (its built-in kustomize renders deploy/kubernetes) is needed: {e}; \
                 scripts/setup installs it where apt knows the package"
            )
        });
    assert!(
        out.status.success(),
        "kubectl kustomize {dir}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Each resource's `kind/name` in rendered YAML.
fn resources(rendered: &str) -> Vec<String> {
    rendered
        .split("\n---\n")
        .map(|doc| {
            let field = |key: &str| {
                doc.lines()
                    .find_map(|l| l.strip_prefix(key))
                    .map(|v| v.trim().to_owned())
                    .unwrap_or_default()
            };
            let name = doc
                .lines()
                .skip_while(|l| *l != "metadata:")
                .find_map(|l| l.strip_prefix("  name: "))
                .unwrap_or_default();
            format!("{}/{}", field("kind: ").to_lowercase(), name.trim())
        })
        .collect()
}

#[test]
fn every_rendered_manifest_validates_against_the_kubernetes_schemas() {
    let dir = tempfile::tempdir().unwrap();
    for overlay in ["sqlite", "postgres"] {
        let rendered = kustomize(&format!("deploy/kubernetes/overlays/{overlay}"));
        let file = dir.path().join(format!("{overlay}.yaml"));
        std::fs::write(&file, &rendered).unwrap();
        let out = Command::new(python_tool("kubernetes-validate"))
            .arg("--strict")
            .arg(&file)
            .output()
            .unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{overlay}: {said}");
        let mut unchecked = 0;
        for resource in resources(&rendered) {
            if resource.starts_with("servicemonitor/") {
                // The Prometheus Operator's kind: no schema of Kubernetes knows it.
                unchecked += 1;
                continue;
            }
            assert!(
                said.contains(&format!("passed for resource {resource} ")),
                "{overlay}: {resource} not validated: {said}"
            );
        }
        assert_eq!(
            said.matches("WARN").count(),
            unchecked,
            "{overlay}: only the ServiceMonitor goes unchecked: {said}"
        );
        let kinds = resources(&rendered);
        for needed in [
            "namespace/gpuledger",
            "deployment/gpuledger-server",
            "service/gpuledger",
            "daemonset/gpuledger-agent",
            "serviceaccount/gpuledger-agent",
            "clusterrole/gpuledger-agent",
            "clusterrolebinding/gpuledger-agent",
        ] {
            assert!(kinds.iter().any(|k| k == needed), "{overlay}: {kinds:?}");
        }
        // The agent reads, and changes nothing.
        let role = rendered
            .split("\n---\n")
            .find(|doc| doc.contains("kind: ClusterRole\n"))
            .unwrap_or_else(|| panic!("{overlay}: no ClusterRole"));
        for verb in ["create", "update", "patch", "delete", "\"*\""] {
            assert!(
                !role.contains(verb),
                "{overlay}: the agent's role may {verb}: {role}"
            );
        }
        match overlay {
            "sqlite" => {
                assert!(rendered.contains("replicas: 1") && rendered.contains("type: Recreate"));
                assert!(kinds
                    .iter()
                    .any(|k| k == "persistentvolumeclaim/gpuledger-data"));
            }
            _ => {
                assert!(rendered.contains("replicas: 2"), "several replicas");
                assert!(
                    rendered.contains("name: gpuledger-database"),
                    "the URL's secret"
                );
                assert!(kinds.iter().any(|k| k == "servicemonitor/gpuledger-server"));
            }
        }
    }
}

/// `GPULEDGER_…` names in `text`.
fn settings(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("GPULEDGER_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        out.insert(name.trim_end_matches('_').to_owned());
        rest = &rest[at + name.len().max(1)..];
    }
    out
}

fn help(bin: &str, args: &[&str]) -> String {
    let out = Command::new(artifact(bin)).args(args).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn every_setting_the_deploy_files_name_is_one_the_binaries_read() {
    let server = help("gpuledger-server", &["serve", "--help"]);
    let agent = help("gpuledger-agent", &["run", "--help"]);
    let mut files = vec![
        ("Dockerfile".to_owned(), read("Dockerfile")),
        (
            "deploy/gpuledger-server.service".into(),
            read("deploy/gpuledger-server.service"),
        ),
        (
            "deploy/gpuledger-agent.service".into(),
            read("deploy/gpuledger-agent.service"),
        ),
    ];
    for overlay in ["sqlite", "postgres"] {
        files.push((
            format!("overlays/{overlay}"),
            kustomize(&format!("deploy/kubernetes/overlays/{overlay}")),
        ));
    }
    for (file, text) in files {
        let named = settings(&text);
        assert!(!named.is_empty(), "{file}");
        for name in named {
            // The log filter is read by the logger, not a flag.
            let read = name == "GPULEDGER_LOG"
                || server.contains(&format!("[env: {name}"))
                || agent.contains(&format!("[env: {name}"));
            assert!(read, "{file} sets {name}, which neither binary reads");
        }
    }
}

/// `--flag` names in `text`: the options a help text lists, or a doc's tables name.
fn flags(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("--") {
        let name: String = rest[at + 2..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
            .collect();
        let starts_a_word = at == 0 || !rest.as_bytes()[at - 1].is_ascii_alphanumeric();
        if starts_a_word && name.chars().next().is_some_and(|c| c.is_ascii_lowercase()) {
            out.insert(format!("--{}", name.trim_end_matches('-')));
        }
        rest = &rest[at + 2 + name.len()..];
    }
    out
}

/// The rows of a doc's markdown tables under `heading` (up to the next `## `).
fn section(doc: &str, heading: &str) -> String {
    let start = doc
        .find(heading)
        .unwrap_or_else(|| panic!("docs/configuration.md has no {heading}"));
    let body = &doc[start + heading.len()..];
    let end = body.find("\n## ").unwrap_or(body.len());
    body[..end]
        .lines()
        .filter(|l| l.starts_with("| `") || l.starts_with("| |"))
        .map(|l| l.split(" | ").take(2).collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_configuration_page_names_exactly_the_flags_and_variables_the_binaries_read() {
    let doc = read("docs/configuration.md");
    let server =
        help("gpuledger-server", &["--help"]) + &help("gpuledger-server", &["serve", "--help"]);
    let agent = help("gpuledger-agent", &["run", "--help"]);
    for (heading, help) in [("## Server\n", &server), ("## Agent\n", &agent)] {
        let table = section(&doc, heading);
        let ignore = ["--help", "--version"];
        // An option's own line starts with it (`  -h, --help`, `      --listen <LISTEN>`);
        // other lines' flags are descriptions naming another command's.
        let options: String = help
            .lines()
            .map(str::trim_start)
            .filter(|l| l.starts_with('-'))
            .filter_map(|l| l.split_whitespace().find(|w| w.starts_with("--")))
            .collect::<Vec<_>>()
            .join(" ");
        let read: BTreeSet<String> = flags(&options)
            .into_iter()
            .filter(|f| !ignore.contains(&f.as_str()))
            .collect();
        let named = flags(&table);
        assert_eq!(
            named.difference(&read).collect::<Vec<_>>(),
            Vec::<&String>::new(),
            "docs/configuration.md {heading:?} names flags the binary does not read"
        );
        assert_eq!(
            read.difference(&named).collect::<Vec<_>>(),
            Vec::<&String>::new(),
            "docs/configuration.md {heading:?} leaves out flags the binary reads"
        );
        // Environment variables: each one a flag reads is in the table; the table's are read
        // (the log filter and the single sign-on secret by the server itself, not by a flag).
        let read_env: BTreeSet<String> = settings(help)
            .into_iter()
            .filter(|n| help.contains(&format!("[env: {n}")))
            .collect();
        let named_env = settings(&table);
        assert_eq!(
            read_env.difference(&named_env).collect::<Vec<_>>(),
            Vec::<&String>::new(),
            "docs/configuration.md {heading:?} leaves out variables the binary reads"
        );
        for name in named_env.difference(&read_env) {
            assert!(
                ["GPULEDGER_LOG", "GPULEDGER_OIDC_CLIENT_SECRET"].contains(&name.as_str()),
                "docs/configuration.md {heading:?} names {name}, which the binary does not read"
            );
        }
    }
    // The README sends people there rather than keeping a second table that could drift.
    assert!(read("README.md").contains("(docs/configuration.md)"));
    assert!(!read("README.md").contains("| `--database-url` |"));
}

/// The ConfigMap's config.toml, as the server will read it.
fn configmap_config(server_yaml: &str) -> String {
    let mut lines = server_yaml
        .lines()
        .skip_while(|l| l.trim() != "config.toml: |");
    lines.next();
    lines
        .take_while(|l| l.starts_with("    "))
        .map(|l| format!("{}\n", &l[4..]))
        .collect()
}

#[tokio::test]
async fn the_manifests_config_and_probe_start_and_answer_a_real_server() {
    let yaml = read("deploy/kubernetes/base/server.yaml");
    let config = configmap_config(&yaml);
    assert!(!config.is_empty(), "{yaml}");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.toml");
    std::fs::write(&path, &config).unwrap();
    let db = test_support::sqlite();
    let server = start_server_with(&db.url, free_port(), Some(&path)).await;
    let probes: BTreeSet<&str> = yaml
        .lines()
        .filter_map(|l| l.trim().strip_prefix("httpGet: { path: "))
        .filter_map(|l| l.split(',').next())
        .collect();
    assert!(!probes.is_empty(), "{yaml}");
    for probe in probes {
        let status = reqwest::get(format!("{}{probe}", server.url))
            .await
            .unwrap()
            .status();
        assert_eq!(status, reqwest::StatusCode::OK, "{probe}");
    }
}

#[test]
fn the_systemd_units_verify() {
    let dir = tempfile::tempdir().unwrap();
    for unit in ["gpuledger-server", "gpuledger-agent"] {
        let text = read(&format!("deploy/{unit}.service"));
        let installed = format!("/usr/local/bin/{unit}");
        assert!(text.contains(&format!("ExecStart={installed} ")), "{text}");
        // As installed, with the binary where the unit expects it.
        let here = text.replace(&installed, artifact(unit).to_str().unwrap());
        let file: &Path = &dir.path().join(format!("{unit}.service"));
        std::fs::write(file, here).unwrap();
        let out = Command::new("systemd-analyze")
            .arg("verify")
            .arg(file)
            .output()
            .expect("systemd-analyze (Debian package systemd) verifies the units");
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && said.trim().is_empty(),
            "{unit}: {said}"
        );
    }
}

/// The images are distroless `cc`: glibc, libgcc and CA certificates, nothing else. The
/// binaries the Dockerfile copies in must need no other shared library (no libssl, no
/// libsqlite: TLS and SQLite are built in), and the Dockerfile must copy them where its
/// entrypoints run them. (The images themselves are not built here: no registry is reachable
/// to pull the base images from.)
#[test]
fn the_images_carry_binaries_that_need_only_what_distroless_has() {
    let dockerfile = read("Dockerfile");
    for target in ["server", "agent"] {
        let bin = format!("gpuledger-{target}");
        assert!(
            dockerfile.contains(&format!("AS {target}\n")),
            "a --target {target} stage"
        );
        assert!(dockerfile.contains(&format!("/out/{bin} /usr/bin/{bin}")));
        assert!(dockerfile.contains(&format!("ENTRYPOINT [\"/usr/bin/{bin}\"]")));
        let out = Command::new("ldd").arg(artifact(&bin)).output().unwrap();
        let needed = String::from_utf8_lossy(&out.stdout);
        for line in needed.lines() {
            let lib = line.split_whitespace().next().unwrap_or_default();
            let in_distroless_cc = [
                "linux-vdso.so",
                "libc.so",
                "libm.so",
                "libgcc_s.so",
                "libdl.so",
                "libpthread.so",
                "librt.so",
                "/lib64/ld-linux",
                "ld-linux",
            ]
            .iter()
            .any(|ok| lib.starts_with(ok) || lib.contains(ok));
            assert!(
                in_distroless_cc,
                "{bin} needs {lib}, which distroless/cc lacks"
            );
        }
    }
}
