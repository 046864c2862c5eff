//! Host specs as operators write them: `[user@]host[:port]`, comma lists, cluster ranges (`node[01-16]`,
//! `gpu-[a-c]`, `n[1,3,5-7]`), `local`, `cmd:COMMAND` (any command that speaks the agent protocol on its
//! stdio: `kubectl exec`, `docker exec`, a local `gpusweep agent`), and named groups from the config file.

use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HostSpec {
    /// This host, in-process.
    Local,
    /// A host of the simulated cluster.
    Demo(String),
    Ssh {
        user: Option<String>,
        host: String,
        port: Option<u16>,
    },
    /// A local command whose stdio is an agent stream.
    Command { command: String },
    /// A `gpusweep serve` read over HTTP(S): `http(s)://node:port[/hosts/NAME]`. Read-only.
    Http { url: HttpUrl },
    /// A fleet read from a Prometheus server's HTTP API: `prom:http://prometheus:9090[?SELECTOR]`. When the
    /// fleet starts it becomes one `PromHost` per host Prometheus knows.
    Prom(PromSpec),
    /// One host of a `prom:` fleet: its `Hostname` (or `instance`) label, and the server it was read from.
    PromHost { server: PromSpec, name: String },
    /// A `gpusweep serve` on this host, through its Unix socket: `unix:/run/gpusweep.sock`.
    Socket { path: String },
}

/// Why a host spec cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("{0:?}: not an http:// or https:// address")]
    NotHttp(String),
    #[error("{0:?}: only scheme://host[:port][/path] (no user, query or fragment)")]
    UrlExtras(String),
    #[error("{spec:?}: {why}")]
    BadUrl { spec: String, why: String },
    #[error("{spec:?}: {host:?} is not a host name")]
    BadHost { spec: String, host: String },
    #[error("{spec:?}: bad port {port:?}")]
    BadPort { spec: String, port: String },
    #[error("{spec:?}: bad path {path:?}")]
    BadPath { spec: String, path: String },
    #[error("{0:?}: '[' without ']'")]
    Bracket(String),
    #[error("{0:?}: junk after ']'")]
    AfterBracket(String),
    #[error("{spec:?}: {user:?} is not a user name")]
    BadUser { spec: String, user: String },
    #[error("{0:?}: empty user before '@'")]
    EmptyUser(String),
    #[error("{spec:?}: {why}")]
    Range { spec: String, why: String },
    #[error("selector {selector:?}: {why}")]
    Selector { selector: String, why: String },
    #[error("{0:?}: the socket's path must be absolute")]
    RelativeSocket(String),
    #[error("cmd: needs a command")]
    EmptyCommand,
    #[error("no group {0:?} in the config file")]
    NoGroup(String),
}

/// An `http(s)://host[:port][/path]` address, parsed by the `url` crate and checked: no user, query or
/// fragment, and a host name of plain characters, so nothing a shell or a request line could misread.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HttpUrl(url::Url);

impl HttpUrl {
    pub fn parse(s: &str) -> Result<HttpUrl, SpecError> {
        if !(s.starts_with("http://") || s.starts_with("https://")) {
            return Err(SpecError::NotHttp(s.to_string()));
        }
        // Refused before parsing: the url crate would encode them, and they have no place in a serve's address.
        if s.contains(['?', '#', '@']) || s.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(SpecError::UrlExtras(s.to_string()));
        }
        let u = url::Url::parse(s).map_err(|e| SpecError::BadUrl {
            spec: s.to_string(),
            why: e.to_string(),
        })?;
        let bad_host = |host: &str| SpecError::BadHost {
            spec: s.to_string(),
            host: host.to_string(),
        };
        match u.host() {
            Some(url::Host::Domain(d)) => {
                let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_');
                if d.is_empty() || !d.chars().all(ok) || d.starts_with('-') {
                    return Err(bad_host(d));
                }
            }
            Some(url::Host::Ipv4(_) | url::Host::Ipv6(_)) => {}
            None => return Err(bad_host("")),
        }
        let path = u.path();
        let path_ok =
            |c: char| c.is_ascii_alphanumeric() || matches!(c, '/' | '-' | '_' | '.' | '~' | '%');
        if !path.chars().all(path_ok) || path.contains("//") {
            return Err(SpecError::BadPath {
                spec: s.to_string(),
                path: path.to_string(),
            });
        }
        Ok(HttpUrl(u))
    }

    pub fn tls(&self) -> bool {
        self.0.scheme() == "https"
    }

    /// A name or an address; an IPv6 literal without its brackets.
    pub fn host(&self) -> String {
        match self.0.host() {
            Some(url::Host::Ipv6(a)) => a.to_string(),
            Some(h) => h.to_string(),
            None => String::new(),
        }
    }

    pub fn port(&self) -> u16 {
        self.0
            .port_or_known_default()
            .unwrap_or(if self.tls() { 443 } else { 80 })
    }

    /// Empty, or starting with '/', without a trailing '/'.
    pub fn path(&self) -> &str {
        self.0.path().trim_end_matches('/')
    }

    /// `scheme://host:port`, brackets around an IPv6 literal.
    pub fn origin(&self) -> String {
        let scheme = if self.tls() { "https" } else { "http" };
        format!("{scheme}://{}", self.host_port())
    }

    fn host_port(&self) -> String {
        let h = self.host();
        if h.contains(':') {
            format!("[{h}]:{}", self.port())
        } else {
            format!("{h}:{}", self.port())
        }
    }

    /// The whole address, normalized (explicit port, no trailing '/').
    pub fn base(&self) -> String {
        format!("{}{}", self.origin(), self.path())
    }

    /// `host:port`, and the host's name under a serve's `/hosts/NAME` when the path names one.
    pub fn label(&self) -> String {
        let hp = self.host_port();
        match self.served_host() {
            Some(name) => format!("{hp}/{name}"),
            None => format!("{hp}{}", self.path()),
        }
    }

    /// NAME, when the address is one host of a serve's: `/hosts/NAME`.
    pub fn served_host(&self) -> Option<&str> {
        self.path()
            .strip_prefix("/hosts/")
            .filter(|name| !name.is_empty() && !name.contains('/'))
    }
}

impl std::fmt::Display for HttpUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.base())
    }
}

/// PromQL label matchers (`job="gpu",cluster=~"a.*"`), checked by `parse_selector` to be only that, so they
/// can be added to gpusweep's own queries.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Selector(String);

impl Selector {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Selector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A Prometheus server and the selector that narrows it to the fleet.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PromSpec {
    pub url: HttpUrl,
    pub selector: Option<Selector>,
}

impl std::fmt::Display for PromSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.selector {
            Some(sel) => write!(f, "prom:{}?{sel}", self.url),
            None => write!(f, "prom:{}", self.url),
        }
    }
}

/// A `prom:` spec's selector: PromQL label matchers (`job="gpu",cluster=~"a.*"`, braces optional), checked to
/// be only that, so it can be added to gpusweep's own queries.
pub fn parse_selector(s: &str) -> Result<Option<Selector>, SpecError> {
    let bad = |why: String| SpecError::Selector {
        selector: s.to_string(),
        why,
    };
    let inner = s
        .trim()
        .strip_prefix('{')
        .and_then(|r| r.strip_suffix('}'))
        .unwrap_or(s.trim())
        .trim();
    if inner.is_empty() {
        return Ok(None);
    }
    // label op "value" (, label op "value")*
    let mut rest = inner;
    let mut out = Vec::new();
    loop {
        let name_len = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        let name = &rest[..name_len];
        if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
            return Err(bad(format!("expected a label name at {rest:?}")));
        }
        rest = rest[name_len..].trim_start();
        let op = ["=~", "!~", "!=", "="]
            .into_iter()
            .find(|o| rest.starts_with(o))
            .ok_or_else(|| bad(format!("expected =, !=, =~ or !~ after {name}")))?;
        rest = rest[op.len()..].trim_start();
        let Some(body) = rest.strip_prefix('"') else {
            return Err(bad(format!("the value of {name} must be in double quotes")));
        };
        let mut end = None;
        let mut escaped = false;
        for (i, c) in body.char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => {
                    end = Some(i);
                    break;
                }
                c if c.is_control() => {
                    return Err(bad("a control character in a value".into()));
                }
                _ => {}
            }
        }
        let end = end.ok_or_else(|| bad(format!("unterminated value of {name}")))?;
        out.push(format!("{name}{op}\"{}\"", &body[..end]));
        rest = body[end + 1..].trim_start();
        if rest.is_empty() {
            break;
        }
        rest = rest
            .strip_prefix(',')
            .ok_or_else(|| bad(format!("expected ',' before {rest:?}")))?
            .trim_start();
        if rest.is_empty() {
            break;
        }
    }
    Ok(Some(Selector(out.join(","))))
}

impl HostSpec {
    /// The name shown for it: whole, never cut (views cut it to fit). Two specs may share a label only
    /// through `unique_labels`, which tells them apart.
    pub fn label(&self) -> String {
        match self {
            HostSpec::Local => local_hostname(),
            HostSpec::Demo(n) => n.clone(),
            HostSpec::Ssh { user, host, port } => {
                let mut s = String::new();
                if let Some(u) = user {
                    s.push_str(u);
                    s.push('@');
                }
                s.push_str(host);
                if let Some(p) = port {
                    s.push_str(&format!(":{p}"));
                }
                s
            }
            HostSpec::Command { command } => format!("cmd:{command}"),
            HostSpec::Http { url } => url.label(),
            HostSpec::Prom(p) => p.to_string(),
            HostSpec::PromHost { name, .. } => name.clone(),
            HostSpec::Socket { path } => format!("unix:{path}"),
        }
    }

    /// The spec as an operator types it (`local`, `cmd:...`, `user@host:port`, a demo host's name).
    pub fn as_typed(&self) -> String {
        match self {
            HostSpec::Local => "local".into(),
            HostSpec::Http { url } => url.base(),
            other => other.label(),
        }
    }

    /// The kind of source its readings come from (an SSH host's agent may turn out agentless once connected).
    pub fn source_kind(&self) -> crate::model::SourceKind {
        use crate::model::SourceKind;
        match self {
            HostSpec::Local => SourceKind::Local,
            HostSpec::Demo(_) => SourceKind::Demo,
            HostSpec::Ssh { .. } | HostSpec::Command { .. } => SourceKind::Agent,
            HostSpec::Http { .. } => SourceKind::Http,
            HostSpec::Prom(_) | HostSpec::PromHost { .. } => SourceKind::Prometheus,
            HostSpec::Socket { .. } => SourceKind::Serve,
        }
    }

    /// Whether no kill, sweep or removal can go through it (HTTP and Prometheus are read-only).
    pub fn read_only(&self) -> bool {
        matches!(
            self,
            HostSpec::Http { .. } | HostSpec::Prom(_) | HostSpec::PromHost { .. }
        )
    }

    /// Whether `query` names this host: the spec as typed, or its label.
    pub fn answers_to(&self, query: &str, label: &str) -> bool {
        let q = query.trim();
        q == label || q == self.as_typed() || q == self.label()
    }
}

/// One label per spec, unique: a label that two specs would share gets ` #2`, ` #3`... on the later ones.
pub fn unique_labels(specs: &[HostSpec]) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(specs.len());
    let mut seen: std::collections::HashSet<String> = std::collections::HashSet::new();
    for s in specs {
        let base = s.label();
        let mut label = base.clone();
        let mut n = 2;
        while !seen.insert(label.clone()) {
            label = format!("{base} #{n}");
            n += 1;
        }
        out.push(label);
    }
    out
}

pub fn local_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// Split on commas that are not inside brackets.
fn split_top(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    out.push(cur);
    out.into_iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// Most hosts one spec may expand to: a typo like `node[1-999999]` is an error, not a hang.
pub const MAX_EXPANSION: usize = 10_000;

/// Most hosts all `--hosts` values and hostfile lines together may name.
pub const MAX_NAMED_HOSTS: usize = 100_000;

/// The most bytes one spec's hosts may take once expanded: counted before a name is made, so a long spec
/// with a range cannot make gigabytes of names before the count refuses it.
pub(crate) const MAX_EXPANSION_BYTES: usize = 16 * 1024 * 1024;

/// One item of a bracket, or a literal: kept as it was written, so a spec is counted before a name is made.
enum Part {
    Text(String),
    /// `from-to`, zero-padded to `width` (0: not padded).
    Nums {
        from: u64,
        to: u64,
        width: usize,
    },
    /// `a-c`.
    Chars {
        from: u8,
        to: u8,
    },
}

impl Part {
    /// How many names it stands for.
    fn count(&self) -> usize {
        match self {
            Part::Text(_) => 1,
            Part::Nums { from, to, .. } => usize::try_from(to - from).map_or(usize::MAX, |n| n + 1),
            Part::Chars { from, to } => usize::from(to - from) + 1,
        }
    }
    /// The longest of its names, in bytes.
    fn longest(&self) -> usize {
        match self {
            Part::Text(t) => t.len(),
            Part::Nums { to, width, .. } => to.to_string().len().max(*width),
            Part::Chars { .. } => 1,
        }
    }
    fn names(&self, out: &mut Vec<String>) {
        match self {
            Part::Text(t) => out.push(t.clone()),
            Part::Nums { from, to, width } => {
                out.extend((*from..=*to).map(|n| format!("{n:0width$}")));
            }
            Part::Chars { from, to } => out.extend((*from..=*to).map(|c| (c as char).to_string())),
        }
    }
}

/// A spec cut at its brackets: each piece is a literal (one part) or a bracket's parts, nothing expanded.
fn pieces(s: &str) -> Result<Vec<Vec<Part>>, SpecError> {
    let range = |why: String| SpecError::Range {
        spec: crate::format::truncate(s, 120),
        why,
    };
    let mut out = Vec::new();
    let mut rest = s;
    while let Some(open) = rest.find('[') {
        let close = rest[open..]
            .find(']')
            .map(|i| open + i)
            .ok_or_else(|| SpecError::Bracket(crate::format::truncate(s, 120)))?;
        out.push(vec![Part::Text(rest[..open].to_string())]);
        let mut parts: Vec<Part> = Vec::new();
        for part in rest[open + 1..close].split(',') {
            let part = part.trim();
            if let Some((a, b)) = part.split_once('-') {
                if let (Ok(x), Ok(y)) = (a.parse::<u64>(), b.parse::<u64>()) {
                    if y < x {
                        return Err(range(format!("range {part} runs backwards")));
                    }
                    if y - x >= MAX_EXPANSION as u64 {
                        return Err(range(format!(
                            "range {part} is larger than {MAX_EXPANSION} hosts"
                        )));
                    }
                    let width = if a.starts_with('0') { a.len() } else { 0 };
                    parts.push(Part::Nums {
                        from: x,
                        to: y,
                        width,
                    });
                } else if a.len() == 1 && b.len() == 1 && a.is_ascii() && b.is_ascii() {
                    let (x, y) = (a.as_bytes()[0], b.as_bytes()[0]);
                    if !(x.is_ascii_alphanumeric() && y.is_ascii_alphanumeric()) || y < x {
                        return Err(range(format!("bad range {part}")));
                    }
                    parts.push(Part::Chars { from: x, to: y });
                } else {
                    return Err(range(format!("bad range {part} (use 01-16 or a-c)")));
                }
            } else if !part.is_empty() {
                parts.push(Part::Text(part.to_string()));
            } else {
                return Err(range("empty item in brackets".into()));
            }
        }
        out.push(parts);
        rest = &rest[close + 1..];
    }
    out.push(vec![Part::Text(rest.to_string())]);
    Ok(out)
}

/// How many names the pieces make and how many bytes at most; None past `MAX_EXPANSION` or
/// `MAX_EXPANSION_BYTES`.
fn size_of(pieces: &[Vec<Part>]) -> Option<(usize, usize)> {
    let mut n = 1usize;
    let mut longest = 0usize;
    for p in pieces {
        let k = p
            .iter()
            .try_fold(0usize, |acc, part| acc.checked_add(part.count()))?;
        n = n.checked_mul(k).filter(|n| *n <= MAX_EXPANSION)?;
        longest += p.iter().map(Part::longest).max().unwrap_or(0);
    }
    n.checked_mul(longest)
        .filter(|b| *b <= MAX_EXPANSION_BYTES)
        .map(|b| (n, b))
}

/// Why a spec (or a list of them) cannot be expanded: too many names.
fn too_large(spec: &str) -> SpecError {
    SpecError::Range {
        spec: crate::format::truncate(spec, 120),
        why: format!(
            "expands to more than {MAX_EXPANSION} hosts or {} MiB of names",
            MAX_EXPANSION_BYTES >> 20
        ),
    }
}

/// How many names a spec makes, counted without making one.
fn count(s: &str) -> Result<(usize, usize), SpecError> {
    size_of(&pieces(s)?).ok_or_else(|| too_large(s))
}

/// Expand every bracket range: `node[01-03]` -> node01 node02 node03 (width kept), `r[1-2]n[1-2]` -> r1n1
/// r1n2 r2n1 r2n2. Counted before any name is made.
pub fn expand(s: &str) -> Result<Vec<String>, SpecError> {
    let pieces = pieces(s)?;
    let (n, _) = size_of(&pieces).ok_or_else(|| too_large(s))?;
    let mut out = vec![String::new()];
    for p in &pieces {
        let mut items = Vec::new();
        for part in p {
            part.names(&mut items);
        }
        let mut next = Vec::with_capacity(out.len() * items.len());
        for head in &out {
            for item in &items {
                next.push(format!("{head}{item}"));
            }
        }
        out = next;
    }
    debug_assert_eq!(out.len(), n);
    Ok(out)
}

/// `[user@]host[:port]`, with `[v6addr]:port` for IPv6 literals.
pub fn parse_one(s: &str) -> Result<HostSpec, SpecError> {
    let bad_port = |p: &str| SpecError::BadPort {
        spec: s.to_string(),
        port: p.to_string(),
    };
    if s == "local" {
        return Ok(HostSpec::Local);
    }
    let (user, rest) = match s.rsplit_once('@') {
        Some((u, r)) if !u.is_empty() => (Some(u.to_string()), r),
        Some(_) => return Err(SpecError::EmptyUser(s.to_string())),
        None => (None, s),
    };
    let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
        let (h, after) = v6
            .split_once(']')
            .ok_or_else(|| SpecError::Bracket(s.to_string()))?;
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p.parse::<u16>().map_err(|_| bad_port(p))?),
            None if after.is_empty() => None,
            None => return Err(SpecError::AfterBracket(s.to_string())),
        };
        (h.to_string(), port)
    } else if let Some((h, p)) = rest.rsplit_once(':') {
        (
            h.to_string(),
            Some(p.parse::<u16>().map_err(|_| bad_port(p))?),
        )
    } else {
        (rest.to_string(), None)
    };
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':' | '%');
    if host.is_empty() || !host.chars().all(ok) || host.starts_with('-') {
        return Err(SpecError::BadHost {
            spec: s.to_string(),
            host,
        });
    }
    if let Some(u) = &user
        && (!u
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
            || u.starts_with('-'))
    {
        return Err(SpecError::BadUser {
            spec: s.to_string(),
            user: u.clone(),
        });
    }
    Ok(HostSpec::Ssh { user, host, port })
}

/// Whether `name` is a host name alone, as SSH would be asked for it: no user, no port, not `local`. What a
/// remote system names (a Prometheus label) may pick a host to open, never a user or a port.
pub fn is_bare_host(name: &str) -> bool {
    matches!(
        parse_one(name),
        Ok(HostSpec::Ssh {
            user: None,
            port: None,
            ..
        })
    )
}

/// Every range of every value counted before one is expanded: thousands of values of a range each would
/// otherwise make millions of names before a limit is met.
fn count_named(values: &[String]) -> Result<(), SpecError> {
    let mut named = 0usize;
    for v in values {
        let v = v.trim();
        if ["prom:", "unix:", "cmd:"].iter().any(|p| v.starts_with(p)) {
            continue;
        }
        for item in split_top(v) {
            let v6 = item
                .split_once("://")
                .is_some_and(|(_, r)| r.starts_with('['));
            named += if v6 { 1 } else { count(&item)?.0 };
            if named > MAX_NAMED_HOSTS {
                return Err(SpecError::Range {
                    spec: crate::format::truncate(v, 120),
                    why: format!("the hosts named come to more than {MAX_NAMED_HOSTS}"),
                });
            }
        }
    }
    Ok(())
}

/// Parse every `--hosts` value (and hostfile lines), expanding groups and ranges. Order kept, duplicates dropped.
pub fn parse_specs(
    values: &[String],
    groups: &BTreeMap<String, Vec<String>>,
) -> Result<Vec<HostSpec>, SpecError> {
    let mut out: Vec<HostSpec> = Vec::new();
    let push = |h: HostSpec, out: &mut Vec<HostSpec>| {
        if !out.contains(&h) {
            out.push(h);
        }
    };
    count_named(values)?;
    for v in values {
        let v = v.trim();
        // A Prometheus address and its selector are taken whole: the selector's commas are its own.
        if let Some(rest) = v.strip_prefix("prom:") {
            let (url, selector) = match rest.split_once('?') {
                Some((u, s)) => (u, parse_selector(s)?),
                None => (rest, None),
            };
            let url = HttpUrl::parse(url)?;
            push(HostSpec::Prom(PromSpec { url, selector }), &mut out);
            continue;
        }
        if let Some(path) = v.strip_prefix("unix:") {
            if !path.starts_with('/') {
                return Err(SpecError::RelativeSocket(v.to_string()));
            }
            push(
                HostSpec::Socket {
                    path: path.to_string(),
                },
                &mut out,
            );
            continue;
        }
        if let Some(cmd) = v.strip_prefix("cmd:") {
            // A command is taken whole: its commas are its own.
            if cmd.trim().is_empty() {
                return Err(SpecError::EmptyCommand);
            }
            push(
                HostSpec::Command {
                    command: cmd.trim().to_string(),
                },
                &mut out,
            );
            continue;
        }
        for item in split_top(v) {
            let name = item.strip_prefix('@').unwrap_or(&item);
            if let Some(members) = groups.get(name) {
                for h in parse_specs(members, &BTreeMap::new())? {
                    push(h, &mut out);
                }
                continue;
            }
            if item.starts_with('@') {
                return Err(SpecError::NoGroup(name.to_string()));
            }
            if item.starts_with("http://") || item.starts_with("https://") {
                // Ranges expand (http://node[01-16]:9401); an IPv6 literal's brackets are not a range.
                let v6 = item
                    .split_once("://")
                    .is_some_and(|(_, r)| r.starts_with('['));
                let each = if v6 {
                    vec![item.clone()]
                } else {
                    expand(&item)?
                };
                for e in each {
                    let url = HttpUrl::parse(&e)?;
                    push(HostSpec::Http { url }, &mut out);
                }
                continue;
            }
            for e in expand(&item)? {
                push(parse_one(&e)?, &mut out);
            }
        }
    }
    Ok(out)
}

/// A hostfile: one spec per line, `#` comments and blank lines ignored. MPI launchers' hostfiles are read too:
/// OpenMPI's and DeepSpeed's `host slots=8` (with `max_slots=`/`max-slots=`), MPICH's `host:8` (a number
/// under 1024 after the colon is its slot count; a port of gpusweep's own spec syntax is 1024 or more, or
/// 22, which is where the slot count would send it anyway). The slot counts say how many ranks a host runs;
/// gpusweep watches every GPU of each host, so only the host is kept.
pub fn parse_hostfile(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .map(hostfile_line)
        .collect()
}

/// One hostfile line as a gpusweep spec.
fn hostfile_line(line: &str) -> String {
    // gpusweep's own specs with spaces of their own are taken whole.
    if ["cmd:", "prom:", "unix:", "http://", "https://"]
        .iter()
        .any(|p| line.starts_with(p))
    {
        return line.to_string();
    }
    let mut words = line.split_whitespace();
    let first = words.next().unwrap_or_default();
    let rest: Vec<&str> = words.collect();
    let mpi_words = !rest.is_empty()
        && rest.iter().all(|w| {
            w.split_once('=').is_some_and(|(k, v)| {
                matches!(k, "slots" | "max_slots" | "max-slots" | "count")
                    && !v.is_empty()
                    && v.bytes().all(|b| b.is_ascii_digit())
            })
        });
    if !rest.is_empty() && !mpi_words {
        // Not an MPI line: left whole, for the spec parser to say what is wrong with it.
        return line.to_string();
    }
    // MPICH: `host:N` (and `host:N:iface`), N a slot count.
    if !first.contains('@') && !first.starts_with('[') {
        let mut parts = first.split(':');
        let host = parts.next().unwrap_or_default();
        if let Some(n) = parts.next()
            && n.bytes().all(|b| b.is_ascii_digit())
            && n.parse::<u32>().is_ok_and(|n| n < 1024)
            && (parts.clone().count() <= 1)
            && !host.is_empty()
        {
            return host.to_string();
        }
    }
    first.to_string()
}

/// Slurm's hostlist syntax (`gpu[01-04,07]`, `rack[1-2]-n[01-02]`, `a,b[1-3]`): every host it names, in
/// order, duplicates dropped. Zero padding is kept from the range's first number, as Slurm does.
pub fn expand_hostlist(list: &str) -> Result<Vec<String>, SpecError> {
    // Counted whole before a name is made: each item's brackets counted, not expanded.
    let (mut n, mut bytes) = (0usize, 0usize);
    for item in split_top(list) {
        let (k, b) = count(&item)?;
        n += k;
        bytes += b;
        if n > MAX_EXPANSION || bytes > MAX_EXPANSION_BYTES {
            return Err(too_large(list));
        }
    }
    let mut seen = std::collections::HashSet::with_capacity(n);
    let mut out: Vec<String> = Vec::with_capacity(n);
    for item in split_top(list) {
        for h in expand(&item)? {
            if seen.insert(h.clone()) {
                out.push(h);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[HostSpec]) -> Vec<String> {
        v.iter().map(super::HostSpec::label).collect()
    }

    #[test]
    fn thousands_of_ranges_are_refused_before_one_is_expanded() {
        // 2,600 items of 10,000 names each: 26 million names, had they been made.
        let list: Vec<String> = (0..2_600).map(|i| format!("n{i}x[0000-9999]")).collect();
        let joined = list.join(",");
        assert!(matches!(
            expand_hostlist(&joined),
            Err(SpecError::Range { .. })
        ));
        let err = parse_specs(&list, &BTreeMap::new()).expect_err("too many");
        assert!(err.to_string().contains("100000"), "{err}");
        // A bracket of a bracket of ranges: counted, not made.
        let deep = "a[0-99]b[0-99]c[0-99]d[0-99]";
        assert!(matches!(expand(deep), Err(SpecError::Range { .. })));
        assert_eq!(count("n[01-16]").expect("ok").0, 16);
    }

    #[test]
    fn ranges_keep_width_and_letters_work() {
        assert_eq!(
            expand("node[01-03]").expect("ok"),
            ["node01", "node02", "node03"]
        );
        assert_eq!(
            expand("gpu-[a-c]").expect("ok"),
            ["gpu-a", "gpu-b", "gpu-c"]
        );
        assert_eq!(expand("n[1,3,5-6]").expect("ok"), ["n1", "n3", "n5", "n6"]);
        assert_eq!(
            expand("r[1-2]n[1-2]").expect("ok"),
            ["r1n1", "r1n2", "r2n1", "r2n2"]
        );
        assert!(expand("n[3-1]").is_err());
        assert!(expand("n[1-99999999]").is_err());
        assert!(expand("n[1-").is_err());
    }

    #[test]
    fn a_hostlist_is_counted_before_a_name_is_made() {
        // 10^6 hosts from three small ranges, and 9,999 names of 21 KB each (200 MB): both refused from
        // their counts alone.
        assert!(expand("a[1-100]b[1-100]c[1-100]").is_err());
        let long = format!("n[1-9999]{}", "x".repeat(21_000));
        assert!(expand(&long).is_err());
        assert!(expand_hostlist(&long).is_err());
        // Many items of a list, each under the limit, are counted together.
        assert!(expand_hostlist("a[1-4000],b[1-4000],c[1-4000]").is_err());
        // At the limit exactly, every host is made, duplicates dropped.
        let v = expand_hostlist("n[1-5000],m[1-4990],n[1-10]").expect("10,000 hosts");
        assert_eq!(v.len(), 9_990);
        assert_eq!(v[0], "n1");
    }

    #[test]
    fn specs_with_users_ports_lists_and_groups() {
        let mut g = BTreeMap::new();
        g.insert("prod".to_string(), vec!["node[1-2]".to_string()]);
        let v = parse_specs(
            &[
                "admin@a:2222,b".into(),
                "@prod".into(),
                "prod".into(),
                "b".into(),
            ],
            &g,
        )
        .expect("ok");
        assert_eq!(names(&v), ["admin@a:2222", "b", "node1", "node2"]);
        assert_eq!(
            v[0],
            HostSpec::Ssh {
                user: Some("admin".into()),
                host: "a".into(),
                port: Some(2222)
            }
        );
        assert_eq!(
            parse_one("[::1]:22").expect("v6"),
            HostSpec::Ssh {
                user: None,
                host: "::1".into(),
                port: Some(22)
            }
        );
    }

    #[test]
    fn hostile_specs_are_refused() {
        assert!(parse_one("a;rm -rf /").is_err());
        assert!(parse_one("-oProxyCommand=x").is_err());
        assert!(parse_one("a:notaport").is_err());
        assert!(parse_one("$(id)@h").is_err());
        assert!(parse_specs(&["@nope".into()], &BTreeMap::new()).is_err());
    }

    #[test]
    fn commands_are_taken_whole() {
        let v = parse_specs(
            &["cmd:docker exec a,b gpusweep agent".into()],
            &BTreeMap::new(),
        )
        .expect("ok");
        assert_eq!(
            v,
            vec![HostSpec::Command {
                command: "docker exec a,b gpusweep agent".into()
            }]
        );
    }

    #[test]
    fn labels_are_whole_and_unique() {
        let long = "x".repeat(40);
        let a = HostSpec::Command {
            command: format!("{long} one"),
        };
        let b = HostSpec::Command {
            command: format!("{long} two"),
        };
        let labels = unique_labels(&[a.clone(), b.clone()]);
        assert_ne!(labels[0], labels[1]);
        assert!(labels[0].ends_with(" one") && labels[1].ends_with(" two"));
        assert!(a.answers_to(&format!("cmd:{long} one"), &labels[0]));
        assert!(!b.answers_to(&format!("cmd:{long} one"), &labels[1]));
        let same = unique_labels(&[HostSpec::Local, HostSpec::Local]);
        assert_eq!(same[1], format!("{} #2", same[0]));
        assert!(HostSpec::Local.answers_to("local", &same[0]));
    }

    #[test]
    fn http_prom_and_socket_specs() {
        let v = parse_specs(
            &[
                "http://node[1-2]:9401,https://[::1]:9443/hosts/gpu-a".into(),
                r#"prom:http://prom:9090?{job="gpu",cluster=~"a,b"}"#.into(),
                "unix:/run/gpusweep.sock".into(),
            ],
            &BTreeMap::new(),
        )
        .expect("ok");
        assert_eq!(
            names(&v),
            [
                "node1:9401",
                "node2:9401",
                "[::1]:9443/gpu-a",
                r#"prom:http://prom:9090?job="gpu",cluster=~"a,b""#,
                "unix:/run/gpusweep.sock"
            ]
        );
        assert_eq!(
            v[2],
            HostSpec::Http {
                url: HttpUrl::parse("https://[::1]:9443/hosts/gpu-a").expect("url")
            }
        );
        assert!(v[0].read_only() && v[3].read_only() && !v[4].read_only());
        assert_eq!(
            HttpUrl::parse("http://n:9401/").expect("ok").base(),
            "http://n:9401"
        );
        for bad in [
            "http://user@n:1",
            "http://n:1/?x=1",
            "http://n:1/#f",
            "http://n;rm:1",
            "http://n:99999",
            "ftp://n",
            "http://n/a b",
        ] {
            assert!(HttpUrl::parse(bad).is_err(), "{bad}");
        }
        for bad in [
            "prom:http://p:9090?job=gpu",
            r#"prom:http://p:9090?job="gpu"}"#,
            r#"prom:http://p:9090?{job="gpu" or vector(1)}"#,
            "unix:relative.sock",
        ] {
            assert!(
                parse_specs(&[bad.into()], &BTreeMap::new()).is_err(),
                "{bad}"
            );
        }
        assert_eq!(
            parse_selector(r#" { a = "x\"y" , b!~"z" } "#)
                .expect("ok")
                .map(|s| s.to_string()),
            Some(r#"a="x\"y",b!~"z""#.to_string())
        );
        assert_eq!(parse_selector(" {} ").expect("ok"), None);
        let u = HttpUrl::parse("http://[::1]:9401/hosts/gpu-b/").expect("v6");
        assert_eq!(
            (u.host(), u.port(), u.path()),
            ("::1".into(), 9401, "/hosts/gpu-b")
        );
        assert_eq!(u.label(), "[::1]:9401/gpu-b");
        assert_eq!(
            HttpUrl::parse("https://n").expect("ok").base(),
            "https://n:443"
        );
    }

    #[test]
    fn mpi_hostfiles_and_slurm_hostlists() {
        let text = "# OpenMPI / DeepSpeed\n10.0.0.1 slots=8\nworker-2 slots=8 max_slots=16\n\
                    # MPICH\nnode3:8\nnode4:8:ib0\nnode5:22\n# gpusweep's own\nadmin@gpu-x:2222\n\
                    gpu-y:2222\ncmd:ssh -p 2 n gpusweep agent\n";
        assert_eq!(
            parse_hostfile(text),
            [
                "10.0.0.1",
                "worker-2",
                "node3",
                "node4",
                "node5",
                "admin@gpu-x:2222",
                "gpu-y:2222",
                "cmd:ssh -p 2 n gpusweep agent"
            ]
        );
        // A line that is neither keeps its words, and the spec parser says what is wrong.
        assert_eq!(parse_hostfile("node1 cores=8"), ["node1 cores=8"]);
        assert!(parse_specs(&parse_hostfile("node1 cores=8"), &BTreeMap::new()).is_err());
        assert_eq!(
            expand_hostlist("gpu[01-04,07]").expect("ok"),
            ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07"]
        );
        assert_eq!(
            expand_hostlist("rack[1-2]-n[08-10],login1,rack1-n08").expect("ok"),
            [
                "rack1-n08",
                "rack1-n09",
                "rack1-n10",
                "rack2-n08",
                "rack2-n09",
                "rack2-n10",
                "login1"
            ]
        );
        assert_eq!(
            expand_hostlist("n[9-11]").expect("ok"),
            ["n9", "n10", "n11"]
        );
        assert!(expand_hostlist("n[3-1]").is_err());
        assert!(expand_hostlist("n[01-04").is_err());
        assert!(expand_hostlist("a[1-100]-b[1-200]").is_err(), "bounded");
    }

    #[test]
    fn hostfile_comments() {
        assert_eq!(
            parse_hostfile("# nodes\nnode1\n\nnode2 # spare\n"),
            ["node1", "node2"]
        );
    }
}
