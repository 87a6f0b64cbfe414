//! What a viewer may see: every team, or only the owners of some. A part of the ledger belongs
//! to the team its owner names under the team dimension (from the process's label, the bill's
//! tag or the cluster map), so a team sees its work, the time its processes held GPUs idle, and
//! the idle and unwatched time of the clusters mapped to it; never another team's part, nor
//! the bill lines that belong to no GPU host. Admins always see everything.

use std::collections::{BTreeMap, BTreeSet};

use crate::allocation::{key_of, GroupBy};
use crate::attribution::{Attribution, Kind, Part};
use crate::owners::{Owner, OwnerSchema, Role};

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scope {
    /// `None`: every team.
    teams: Option<BTreeSet<String>>,
}

/// Every team, to lend where a scope is borrowed.
pub static EVERY_TEAM: Scope = Scope::all();

/// Why a list of teams cannot be a scope.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScopeError {
    #[error(
        "{0:?} is not a team name: 1 to 64 characters, no control characters, not starting with ("
    )]
    BadTeam(String),
    #[error("a scope names at least one team (leave it out to see every team)")]
    Empty,
}

impl Scope {
    /// Every team.
    pub const fn all() -> Scope {
        Scope { teams: None }
    }

    /// Only these teams, each checked (1 to 64 characters, no control characters), at least one.
    pub fn teams<I, S>(teams: I) -> Result<Scope, ScopeError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut set = BTreeSet::new();
        for team in teams {
            let team = team.as_ref().trim();
            // "(idle)" and its like name the buckets of nobody in particular, never a team.
            if team.is_empty()
                || team.starts_with('(')
                || team.chars().count() > 64
                || team.chars().any(char::is_control)
            {
                return Err(ScopeError::BadTeam(team.chars().take(80).collect()));
            }
            set.insert(team.to_owned());
        }
        if set.is_empty() {
            return Err(ScopeError::Empty);
        }
        Ok(Scope { teams: Some(set) })
    }

    /// A comma-separated list of teams as people type it (`serving, research`); blank is every
    /// team.
    pub fn parse_list(text: &str) -> Result<Scope, ScopeError> {
        let names: Vec<&str> = text.split(',').filter(|t| !t.trim().is_empty()).collect();
        if names.is_empty() {
            return Ok(Scope::all());
        }
        Scope::teams(names)
    }

    /// The stored form: `None` for every team, else a JSON array of names.
    pub fn to_stored(&self) -> Option<String> {
        self.teams
            .as_ref()
            .map(|t| serde_json::to_string(t).unwrap_or_else(|_| "[]".to_owned()))
    }

    /// Reads [`Scope::to_stored`] back. A stored value that is not a list of names scopes to
    /// no team at all: a damaged row must never widen what someone sees.
    pub fn from_stored(stored: Option<&str>) -> Scope {
        match stored {
            None => Scope::all(),
            Some(text) => Scope {
                teams: Some(serde_json::from_str(text).unwrap_or_default()),
            },
        }
    }

    pub fn is_all(&self) -> bool {
        self.teams.is_none()
    }

    /// The teams, in order; `None` for every team.
    pub fn team_names(&self) -> Option<&BTreeSet<String>> {
        self.teams.as_ref()
    }

    /// `serving, research`, or `every team`.
    pub fn describe(&self) -> String {
        match &self.teams {
            None => "every team".to_owned(),
            Some(t) => t.iter().cloned().collect::<Vec<_>>().join(", "),
        }
    }

    pub fn admits_team(&self, team: &str) -> bool {
        self.teams.as_ref().is_none_or(|t| t.contains(team))
    }

    /// Whether `owner` is one of the teams'. An owner without a team (and every owner, where no
    /// dimension plays the team role) belongs to none.
    pub fn admits(&self, owner: &Owner, schema: &OwnerSchema) -> bool {
        match &self.teams {
            None => true,
            Some(t) => schema
                .value(owner, Role::Team)
                .is_some_and(|v| t.contains(v)),
        }
    }

    pub fn admits_part(&self, part: &Part, schema: &OwnerSchema) -> bool {
        self.admits(&part.owner, schema)
    }

    /// The keys of `by` (owners, hosts, GPUs, …) that are wholly the scope's teams': every part
    /// under them is one of its teams', or idle or unwatched time that names no team, and one
    /// part at least is its teams'. What a scoped reader may see of anything listed by key
    /// (a budget, an anomaly, a recommendation's GPUs, a host's idle episode) without seeing
    /// another team's money in it. `None`: every key (the scope is every team).
    ///
    /// The buckets of nobody in particular (`(idle)`, `(unmonitored)`, `(unlabeled)`, a host
    /// not known) are never held: they are the whole fleet's.
    pub fn held_keys(
        &self,
        attribution: &Attribution,
        by: GroupBy,
        schema: &OwnerSchema,
    ) -> Option<BTreeSet<String>> {
        self.held_by(attribution, schema, |p| key_of(p, by, attribution))
    }

    /// The hosts wholly the scope's teams', as [`host_key`]s (a name alone may be in two
    /// clusters).
    pub fn held_hosts(
        &self,
        attribution: &Attribution,
        schema: &OwnerSchema,
    ) -> Option<BTreeSet<String>> {
        self.held_by(attribution, schema, |p| {
            attribution
                .hosts
                .get(&p.host_id)
                .map_or_else(|| "?".to_owned(), |h| host_key(&h.cluster, &h.hostname))
        })
    }

    /// [`Scope::held_keys`] keyed by `key` (a host's cluster and name, say).
    pub fn held_by(
        &self,
        attribution: &Attribution,
        schema: &OwnerSchema,
        key: impl Fn(&Part) -> String,
    ) -> Option<BTreeSet<String>> {
        if self.is_all() {
            return None;
        }
        let (mut ours, mut theirs) = (BTreeSet::new(), BTreeSet::new());
        for p in &attribution.parts {
            let nobodys = schema.value(&p.owner, Role::Team).is_none()
                && matches!(p.kind, Kind::Idle | Kind::Unmonitored);
            if nobodys {
                continue;
            }
            let key = key(p);
            if self.admits_part(p, schema) {
                ours.insert(key);
            } else {
                theirs.insert(key);
            }
        }
        Some(
            ours.difference(&theirs)
                .filter(|k| !k.starts_with('(') && k.as_str() != "?")
                .cloned()
                .collect(),
        )
    }

    /// The attribution as the scope sees it: its teams' parts, the hosts they are on, and no
    /// cost outside GPU hosts. Every team's is the attribution itself.
    pub fn restrict(&self, attribution: Attribution, schema: &OwnerSchema) -> Attribution {
        if self.is_all() {
            return attribution;
        }
        let parts: Vec<Part> = attribution
            .parts
            .into_iter()
            .filter(|p| self.admits_part(p, schema))
            .collect();
        let on: BTreeSet<i64> = parts.iter().map(|p| p.host_id).collect();
        let hosts = attribution
            .hosts
            .into_iter()
            .filter(|(id, _)| on.contains(id))
            .collect();
        Attribution {
            parts,
            unattributed: BTreeMap::new(),
            unattributed_hours: BTreeMap::new(),
            hosts,
        }
    }
}

/// A host as [`Scope::held_hosts`] names it: `cluster/hostname`.
pub fn host_key(cluster: &str, hostname: &str) -> String {
    format!("{cluster}/{hostname}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attribution::Kind;
    use rust_decimal::Decimal;
    use std::collections::HashMap;

    fn part(host_id: i64, team: Option<&str>, kind: Kind) -> Part {
        Part {
            hour_ms: 0,
            host_id,
            gpu_uuid: Some(format!("GPU-{host_id}")),
            owner: team.map(|t| ("team", t)).into_iter().collect(),
            kind,
            pricing_category: "Standard".into(),
            currency: "USD".into(),
            cost: Decimal::ONE,
            estimated: false,
            gpu_seconds: 3600.0,
            util_gpu_seconds: 0.0,
            util_known_seconds: 0.0,
            energy_j: 0.0,
            energy_known_seconds: 0.0,
        }
    }

    fn host(id: i64) -> crate::telemetry::HostRow {
        crate::telemetry::HostRow {
            id,
            hostname: format!("h{id}"),
            cluster: "c".into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_scope_keeps_its_teams_parts_and_hosts_only() {
        let schema = OwnerSchema::default();
        let attribution = Attribution {
            parts: vec![
                part(1, Some("alpha"), Kind::Used),
                part(1, None, Kind::Idle),
                part(2, Some("bravo"), Kind::Used),
                part(3, Some("alpha"), Kind::Idle),
            ],
            unattributed: [("USD".to_owned(), Decimal::TEN)].into(),
            unattributed_hours: BTreeMap::new(),
            hosts: HashMap::from([(1, host(1)), (2, host(2)), (3, host(3))]),
        };
        let alpha = Scope::teams(["alpha"]).unwrap();
        let seen = alpha.restrict(attribution.clone(), &schema);
        assert_eq!(seen.parts.len(), 2);
        assert!(seen
            .parts
            .iter()
            .all(|p| p.owner.get("team") == Some("alpha")));
        let mut hosts: Vec<i64> = seen.hosts.keys().copied().collect();
        hosts.sort();
        assert_eq!(hosts, vec![1, 3]);
        assert!(seen.unattributed.is_empty());
        assert_eq!(
            Scope::all().restrict(attribution.clone(), &schema),
            attribution
        );
    }

    #[test]
    fn a_key_is_held_when_no_other_team_has_a_part_of_it() {
        let schema = OwnerSchema::default();
        let attribution = Attribution {
            parts: vec![
                part(1, Some("alpha"), Kind::Used),
                part(1, None, Kind::Idle),
                part(2, Some("alpha"), Kind::Used),
                part(2, Some("bravo"), Kind::HeldIdle),
                part(3, None, Kind::Used),
                part(3, Some("alpha"), Kind::Used),
                part(4, None, Kind::Idle),
            ],
            unattributed: BTreeMap::new(),
            unattributed_hours: BTreeMap::new(),
            hosts: HashMap::from([(1, host(1)), (2, host(2)), (3, host(3)), (4, host(4))]),
        };
        let alpha = Scope::teams(["alpha"]).unwrap();
        // Host 1: alpha's work and nobody's idle time. Host 2 has bravo's part, host 3 work of
        // no known team, host 4 nothing of alpha's.
        assert_eq!(
            alpha.held_keys(&attribution, GroupBy::Host, &schema),
            Some(BTreeSet::from(["h1".to_owned()]))
        );
        assert_eq!(
            alpha.held_keys(&attribution, GroupBy::TEAM, &schema),
            Some(BTreeSet::from(["alpha".to_owned()]))
        );
        assert_eq!(
            Scope::all().held_keys(&attribution, GroupBy::Host, &schema),
            None
        );
        // Idle time on a cluster mapped to alpha is alpha's, but "(idle)" is everybody's
        // bucket: never held.
        let idle = Attribution {
            parts: vec![
                part(1, Some("alpha"), Kind::Idle),
                part(4, None, Kind::Idle),
            ],
            ..attribution.clone()
        };
        assert_eq!(
            alpha.held_keys(&idle, GroupBy::TEAM, &schema),
            Some(BTreeSet::new())
        );
        assert_eq!(
            alpha.held_keys(&idle, GroupBy::Host, &schema),
            Some(BTreeSet::from(["h1".to_owned()]))
        );
    }

    #[test]
    fn stored_scopes_read_back_and_damage_narrows() {
        let s = Scope::parse_list(" serving, research ,").unwrap();
        assert_eq!(s.describe(), "research, serving");
        assert_eq!(Scope::from_stored(s.to_stored().as_deref()), s);
        assert_eq!(Scope::from_stored(None), Scope::all());
        assert_eq!(Scope::all().to_stored(), None);
        let damaged = Scope::from_stored(Some("not json"));
        assert!(!damaged.is_all());
        assert!(!damaged.admits_team("serving"));
        assert_eq!(Scope::parse_list("  ").unwrap(), Scope::all());
        assert_eq!(Scope::parse_list(" , ").unwrap(), Scope::all());
        assert!(matches!(
            Scope::teams(["ok", "bad\u{7}"]),
            Err(ScopeError::BadTeam(_))
        ));
        assert!(matches!(
            Scope::teams(["(idle)"]),
            Err(ScopeError::BadTeam(_))
        ));
        assert_eq!(Scope::teams(Vec::<String>::new()), Err(ScopeError::Empty));
    }

    #[test]
    fn the_team_is_whichever_dimension_plays_the_team_role() {
        let config: crate::owners::OwnersConfig = [(
            "squad".to_owned(),
            crate::owners::DimensionConfig {
                role: Some(Role::Team),
                ..Default::default()
            },
        )]
        .into();
        let schema = OwnerSchema::from_config(&config).unwrap();
        let alpha = Scope::teams(["alpha"]).unwrap();
        let by_team: Owner = [("team", "alpha")].into_iter().collect();
        let by_squad: Owner = [("squad", "alpha")].into_iter().collect();
        assert!(!alpha.admits(&by_team, &schema));
        assert!(alpha.admits(&by_squad, &schema));
        assert!(Scope::all().admits(&by_team, &schema));
    }
}
