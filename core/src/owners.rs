//! Who owns GPU time: the owner dimensions as data. One schema names the dimensions, the role
//! each plays (the serving endpoint, the training run, the team alerts go to, the model) and
//! where its value comes from: a label in the process's environment, a tag on the bill line, or
//! the host's cluster. Attribution reads the schema; rollups key rows by the owner (every
//! dimension's value at once); pages, the API's `by=` and CSVs list its dimensions.
//!
//! The config's `[owners]` table adds dimensions to the default four (`model`, `experiment`,
//! `endpoint`, `team`) or changes them, one line each:
//!
//! ```toml
//! [owners]
//! cost_center = { from = ["label:cost_center", "tag:CostCenter"] }
//! business_unit = { clusters = { train-east = "research", serve-west = "product" } }
//! service = { role = "endpoint" }   # the endpoint role moves to `service`
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::Deserialize;

/// What a dimension stands for where the product needs it by meaning, not by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The model served or trained: right-sizing looks at each.
    Model,
    /// A training run: cost per run, spot candidates.
    Experiment,
    /// A serving endpoint: cost per 1,000 requests, right-sizing.
    Endpoint,
    /// Who is alerted: Slack routes match its values.
    Team,
}

impl Role {
    pub const ALL: [Role; 4] = [Role::Model, Role::Experiment, Role::Endpoint, Role::Team];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Model => "model",
            Role::Experiment => "experiment",
            Role::Endpoint => "endpoint",
            Role::Team => "team",
        }
    }
}

/// Where a dimension's value is read: the first listed label that is set, else the first listed
/// tag, else the cluster's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A label the agent read from the process's environment (`GPULEDGER_TEAM` → `team`, or an
    /// extra key the agent is configured with, lower-cased).
    Label(String),
    /// A tag on the bill line that priced the host-hour (FOCUS `Tags`, a cost allocation tag).
    Tag(String),
}

impl Source {
    fn parse(text: &str) -> Result<Source, String> {
        match text.split_once(':') {
            Some(("label", key)) if !key.is_empty() => Ok(Source::Label(key.to_owned())),
            Some(("tag", key)) if !key.is_empty() => Ok(Source::Tag(key.to_owned())),
            _ => Err(format!(
                "source {text:?} is neither \"label:KEY\" (a process environment label) nor \
                 \"tag:KEY\" (a bill tag)"
            )),
        }
    }
}

/// One owner dimension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dimension {
    pub name: String,
    pub role: Option<Role>,
    pub sources: Vec<Source>,
    /// The value for hosts of a cluster, where no source above gave one.
    pub clusters: BTreeMap<String, String>,
}

/// A dimension as the config writes it.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DimensionConfig {
    pub role: Option<Role>,
    /// `label:KEY` or `tag:KEY`, first first; a new dimension reads `label:<its name>` if unset.
    pub from: Option<Vec<String>>,
    #[serde(default)]
    pub clusters: BTreeMap<String, String>,
}

/// The config's `[owners]` table: dimension name → how to read it.
pub type OwnersConfig = BTreeMap<String, DimensionConfig>;

/// The owner dimensions, in the order pages and CSVs show them: the default four first, then
/// the config's others by name.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "OwnersConfig")]
pub struct OwnerSchema {
    dimensions: Vec<Dimension>,
}

impl Default for OwnerSchema {
    fn default() -> Self {
        OwnerSchema {
            dimensions: Role::ALL
                .into_iter()
                .map(|role| Dimension {
                    name: role.as_str().to_owned(),
                    role: Some(role),
                    sources: default_sources(role),
                    clusters: BTreeMap::new(),
                })
                .collect(),
        }
    }
}

/// Where a default dimension reads its value: the label of its name (`GPULEDGER_TEAM`), and for
/// the team, where nobody set one, the account of the Slurm job the process runs in (what a
/// Slurm site charges GPU time to), else the Kubernetes namespace of its pod.
fn default_sources(role: Role) -> Vec<Source> {
    let mut sources = vec![Source::Label(role.as_str().to_owned())];
    if role == Role::Team {
        sources.push(Source::Label("slurm_account".into()));
        sources.push(Source::Label("k8s_namespace".into()));
    }
    sources
}

/// Names that grouping or the allocation API and drill-downs already use for something else.
const RESERVED: [&str; 12] = [
    "cluster",
    "host",
    "gpu",
    "instance_type",
    "pricing_category",
    "kind",
    "from",
    "to",
    "by",
    "step",
    "format",
    "key",
];

impl TryFrom<OwnersConfig> for OwnerSchema {
    type Error = String;

    fn try_from(config: OwnersConfig) -> Result<Self, String> {
        OwnerSchema::from_config(&config)
    }
}

impl OwnerSchema {
    /// The default four with the config's changes and additions; an error names what is wrong.
    pub fn from_config(config: &OwnersConfig) -> Result<OwnerSchema, String> {
        let mut schema = OwnerSchema::default();
        // A role given explicitly to one dimension leaves the default dimension that had it
        // (unless the config gives it that role again).
        let claimed: BTreeSet<Role> = config.values().filter_map(|d| d.role).collect();
        for d in &mut schema.dimensions {
            let restated = config.get(&d.name).and_then(|c| c.role);
            if d.role.is_some_and(|r| claimed.contains(&r)) && restated != d.role {
                d.role = None;
            }
        }
        for (name, spec) in config {
            let valid = !name.is_empty()
                && name.len() <= 64
                && name.starts_with(|c: char| c.is_ascii_lowercase())
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
            if !valid {
                return Err(format!(
                    "owners.{name}: a dimension's name is lower-case letters, digits and _, \
                     starting with a letter (at most 64)"
                ));
            }
            if RESERVED.contains(&name.as_str()) {
                return Err(format!(
                    "owners.{name}: `{name}` already means something else (a grouping or a \
                     parameter of the API); name the dimension otherwise"
                ));
            }
            let sources = match &spec.from {
                Some(list) => Some(
                    list.iter()
                        .map(|s| Source::parse(s))
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(|e| format!("owners.{name}: {e}"))?,
                ),
                None => None,
            };
            // A cluster's value becomes an owner as it is written: stored, shown, matched by
            // scopes. A control character (a NUL PostgreSQL refuses in text) is refused here.
            if let Some((cluster, _)) = spec
                .clusters
                .iter()
                .find(|(c, v)| c.chars().chain(v.chars()).any(char::is_control))
            {
                return Err(format!(
                    "owners.{name}.clusters.{}: a cluster and its owner are text without \
                     control characters",
                    cluster.escape_debug()
                ));
            }
            let existing = schema.dimensions.iter_mut().find(|d| &d.name == name);
            match existing {
                Some(d) => {
                    if spec.role.is_some() {
                        d.role = spec.role;
                    }
                    // Without `from`, a default dimension keeps reading where it did.
                    if let Some(sources) = sources {
                        d.sources = sources;
                    }
                    d.clusters = spec.clusters.clone();
                }
                None => schema.dimensions.push(Dimension {
                    name: name.clone(),
                    role: spec.role,
                    sources: sources.unwrap_or_else(|| vec![Source::Label(name.clone())]),
                    clusters: spec.clusters.clone(),
                }),
            }
        }
        for role in Role::ALL {
            let with: Vec<&str> = schema
                .dimensions
                .iter()
                .filter(|d| d.role == Some(role))
                .map(|d| d.name.as_str())
                .collect();
            if with.len() > 1 {
                return Err(format!(
                    "owners: role {} is given to {}; give it to one dimension",
                    role.as_str(),
                    with.join(" and ")
                ));
            }
            // Runs, cost per request, right-sizing and team alerts each need theirs.
            if with.is_empty() {
                return Err(format!(
                    "owners: no dimension has the role {}; give it to one (role = \"{}\")",
                    role.as_str(),
                    role.as_str()
                ));
            }
        }
        Ok(schema)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.dimensions.iter().map(|d| d.name.as_str())
    }

    /// The dimension playing `role`, if any does.
    pub fn role(&self, role: Role) -> Option<&str> {
        self.dimensions
            .iter()
            .find(|d| d.role == Some(role))
            .map(|d| d.name.as_str())
    }

    /// The value of `role` in `owner`.
    pub fn value<'a>(&self, owner: &'a Owner, role: Role) -> Option<&'a str> {
        owner.get(self.role(role)?)
    }

    /// Whether `dimension` can name the owner of time nobody watched (unmonitored cost), from a
    /// bill tag or the cluster map: then not all of that cost is under "(unmonitored)" in it.
    pub fn names_unwatched_owners(&self, dimension: &str) -> bool {
        self.dimensions
            .iter()
            .any(|d| d.name == dimension && (d.reads_tags() || !d.clusters.is_empty()))
    }

    /// Whether any dimension reads bill tags (attribution parses them only then).
    pub fn reads_tags(&self) -> bool {
        self.dimensions.iter().any(Dimension::reads_tags)
    }

    /// The owner of a process's work on a host of `cluster`, from its environment labels (the
    /// first listed label that is set) or else the cluster's value. A dimension that also reads
    /// a bill tag is left open for [`OwnerSchema::with_tags`] where no label gave it.
    pub fn owner_of(&self, labels: &BTreeMap<String, String>, cluster: &str) -> Owner {
        let mut owner = BTreeMap::new();
        for d in &self.dimensions {
            let label = d.sources.iter().find_map(|s| match s {
                Source::Label(k) => labels.get(k).filter(|v| !v.is_empty()),
                Source::Tag(_) => None,
            });
            let value = match label {
                Some(v) => Some(v),
                None if d.reads_tags() => None,
                None => d.clusters.get(cluster),
            };
            if let Some(v) = value.filter(|v| !v.is_empty()) {
                owner.insert(d.name.clone(), v.clone());
            }
        }
        Owner(Arc::new(owner))
    }

    /// The owner of work done, or memory held, by processes the agent cannot see (in another
    /// PID namespace): every dimension the cluster does not name is [`UNSEEN_OWNER`], so the
    /// use is named as such wherever owners are listed, never "(idle)".
    pub fn unseen_owner(&self, cluster: &str) -> Owner {
        let mut owner = BTreeMap::new();
        for d in &self.dimensions {
            let value = d.clusters.get(cluster).filter(|v| !v.is_empty());
            owner.insert(
                d.name.clone(),
                value.cloned().unwrap_or_else(|| UNSEEN_OWNER.to_owned()),
            );
        }
        Owner(Arc::new(owner))
    }

    /// `owner` (from [`OwnerSchema::owner_of`]) completed from the tags of the bill line that
    /// priced it: a dimension no label gave takes the first listed tag that is set, or else the
    /// cluster's value. A process's own label always wins over the bill's tag.
    pub fn with_tags(
        &self,
        owner: &Owner,
        tags: &BTreeMap<String, String>,
        cluster: &str,
    ) -> Owner {
        let mut out = owner.clone();
        for d in self.dimensions.iter().filter(|d| d.reads_tags()) {
            if out.0.contains_key(&d.name) {
                continue;
            }
            // Bill tags are free text: a control character (a JSON `\u0000`, say) never
            // becomes part of an owner, as it never does from a process label.
            let tag = d.sources.iter().find_map(|s| match s {
                Source::Tag(k) => tags
                    .get(k)
                    .filter(|v| !v.is_empty() && !v.chars().any(char::is_control)),
                Source::Label(_) => None,
            });
            if let Some(v) = tag.or_else(|| d.clusters.get(cluster)) {
                if !v.is_empty() {
                    Arc::make_mut(&mut out.0).insert(d.name.clone(), v.clone());
                }
            }
        }
        out
    }
}

impl Dimension {
    fn reads_tags(&self) -> bool {
        self.sources.iter().any(|s| matches!(s, Source::Tag(_)))
    }
}

/// What processes the agent cannot see are listed under, in every owner dimension.
pub const UNSEEN_OWNER: &str = "(unseen process)";

/// A dimension's name for the life of the process: names come from the config, so there are a
/// handful, each kept once however often a schema is read.
pub fn intern(name: &str) -> &'static str {
    static NAMES: std::sync::Mutex<std::collections::BTreeSet<&'static str>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let mut names = NAMES
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(n) = names.get(name) {
        return n;
    }
    let leaked: &'static str = Box::leak(name.to_owned().into_boxed_str());
    names.insert(leaked);
    leaked
}

/// One owner: a value per dimension that has one (no entry where none is known). Shared, not
/// copied: a month's ledger holds millions of parts and a few thousand distinct owners.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Owner(Arc<BTreeMap<String, String>>);

impl Owner {
    pub fn get(&self, dimension: &str) -> Option<&str> {
        self.0.get(dimension).map(String::as_str)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// The owner's one text form, as the owners table keys it: a JSON object with keys in
    /// order and no spaces (`{"model":"llama","team":"research"}`; `{}` for nobody).
    pub fn key(&self) -> String {
        serde_json::to_string(&*self.0).unwrap_or_else(|_| "{}".to_owned())
    }

    /// Reads [`Owner::key`]'s form back (any JSON object of strings; other values are skipped).
    pub fn from_key(key: &str) -> Owner {
        let parsed: BTreeMap<String, serde_json::Value> =
            serde_json::from_str(key).unwrap_or_default();
        Owner(Arc::new(
            parsed
                .into_iter()
                .filter_map(|(k, v)| match v {
                    serde_json::Value::String(s) if !s.is_empty() => Some((k, s)),
                    _ => None,
                })
                .collect(),
        ))
    }
}

impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for Owner {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        Owner(Arc::new(
            iter.into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .filter(|(_, v)| !v.is_empty())
                .collect(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> Result<OwnerSchema, String> {
        #[derive(Deserialize)]
        struct C {
            owners: OwnersConfig,
        }
        let c: C = toml::from_str(text).map_err(|e| e.to_string())?;
        OwnerSchema::from_config(&c.owners)
    }

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn the_default_four_read_their_labels_and_play_their_roles() {
        let s = OwnerSchema::default();
        assert_eq!(
            s.names().collect::<Vec<_>>(),
            ["model", "experiment", "endpoint", "team"]
        );
        let o = s.owner_of(&map(&[("team", "research"), ("other", "x")]), "c");
        assert_eq!(o.key(), r#"{"team":"research"}"#);
        assert_eq!(s.value(&o, Role::Team), Some("research"));
        assert_eq!(s.value(&o, Role::Model), None);
    }

    #[test]
    fn a_slurm_jobs_account_is_its_team_unless_the_process_names_one() {
        let s = OwnerSchema::default();
        let job = map(&[("slurm_account", "vision"), ("slurm_job_name", "sweep")]);
        assert_eq!(s.owner_of(&job, "c").key(), r#"{"team":"vision"}"#);
        let both = map(&[("slurm_account", "vision"), ("team", "search")]);
        assert_eq!(s.owner_of(&both, "c").key(), r#"{"team":"search"}"#);
        let pod = map(&[("k8s_namespace", "ranking"), ("k8s_pod", "ranker-0")]);
        assert_eq!(s.owner_of(&pod, "c").key(), r#"{"team":"ranking"}"#);
        // Configuring the team's clusters keeps where it reads; `from` replaces it.
        let c = config("[owners]\nteam = { clusters = { lab = \"lab-team\" } }").unwrap();
        assert_eq!(c.owner_of(&job, "c").key(), r#"{"team":"vision"}"#);
        assert_eq!(c.owner_of(&map(&[]), "lab").key(), r#"{"team":"lab-team"}"#);
        let c = config("[owners]\nteam = { from = [\"label:team\"] }").unwrap();
        assert_eq!(c.owner_of(&job, "c").key(), "{}");
    }

    #[test]
    fn one_line_adds_a_dimension_read_from_a_label_then_a_tag_then_the_cluster() {
        let s = config(
            r#"[owners]
cost_center = { from = ["label:cost_center", "tag:CostCenter"], clusters = { lab = "cc-lab" } }"#,
        )
        .unwrap();
        assert_eq!(s.names().last(), Some("cost_center"));
        let labels = map(&[("cost_center", "cc-1")]);
        let tags = map(&[("CostCenter", "cc-bill")]);
        let none = BTreeMap::new();
        let priced =
            |labels: &BTreeMap<String, String>, tags: &BTreeMap<String, String>, cluster| {
                s.with_tags(&s.owner_of(labels, cluster), tags, cluster)
            };
        assert_eq!(
            priced(&labels, &tags, "lab").get("cost_center"),
            Some("cc-1"),
            "the process's label wins"
        );
        assert_eq!(
            priced(&none, &tags, "lab").get("cost_center"),
            Some("cc-bill")
        );
        assert_eq!(
            priced(&none, &none, "lab").get("cost_center"),
            Some("cc-lab")
        );
        assert_eq!(priced(&none, &none, "other").get("cost_center"), None);
        let control = map(&[("CostCenter", "cc\u{0}")]);
        assert_eq!(
            priced(&none, &control, "other").get("cost_center"),
            None,
            "a control character in a tag never becomes an owner"
        );
        assert_eq!(
            s.owner_of(&none, "lab").get("cost_center"),
            None,
            "left open for the bill's tag"
        );
    }

    #[test]
    fn a_role_moves_to_the_dimension_that_claims_it() {
        let s = config(
            "[owners]\nservice = { role = \"endpoint\" }\nendpoint = { from = [\"label:ep\"] }",
        )
        .unwrap();
        assert_eq!(s.role(Role::Endpoint), Some("service"));
        assert!(
            s.names().any(|n| n == "endpoint"),
            "the old dimension stays, without the role"
        );
        let o = s.owner_of(&map(&[("service", "chat")]), "c");
        assert_eq!(s.value(&o, Role::Endpoint), Some("chat"));
    }

    #[test]
    fn bad_schemas_say_what_is_wrong() {
        let e = config("[owners]\nCost = {}").unwrap_err();
        assert!(e.contains("owners.Cost"), "{e}");
        let e = config("[owners]\nhost = {}").unwrap_err();
        assert!(e.contains("already means something else"), "{e}");
        let e = config("[owners]\nformat = {}").unwrap_err();
        assert!(e.contains("owners.format"), "{e}");
        let e = config("[owners]\nexperiment = { role = \"team\" }").unwrap_err();
        assert!(e.contains("no dimension has the role experiment"), "{e}");
        let e = config("[owners]\na = { from = [\"env:X\"] }").unwrap_err();
        assert!(e.contains("label:KEY"), "{e}");
        let e = config("[owners]\na = { role = \"team\" }\nb = { role = \"team\" }").unwrap_err();
        assert!(e.contains("a and b"), "{e}");
        // A NUL (PostgreSQL refuses it in text) or another control character in a cluster's
        // owner, or in the cluster's name, never becomes an owner.
        let e = config("[owners]\nteam = { clusters = { lab = \"lab\\u0000team\" } }").unwrap_err();
        assert!(e.contains("owners.team.clusters.lab"), "{e}");
        let e = config("[owners]\nteam = { clusters = { \"l\\tab\" = \"lab\" } }").unwrap_err();
        assert!(e.contains("owners.team.clusters.l\\tab"), "{e}");
    }

    #[test]
    fn the_key_is_one_text_per_owner_and_reads_back() {
        let o: Owner = [
            ("team", "r&d \"x\""),
            ("model", "llama-ü"),
            ("endpoint", ""),
        ]
        .into_iter()
        .collect();
        assert_eq!(o.key(), r#"{"model":"llama-ü","team":"r&d \"x\""}"#);
        assert_eq!(Owner::from_key(&o.key()), o);
        assert_eq!(Owner::default().key(), "{}");
    }
}
