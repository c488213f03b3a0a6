//! The rules [`Config::validate`] checks: every one that needs no file
//! access, each error naming the first offending field.

use std::collections::HashMap;
use std::path::Path;

use s3dma_config::{Check, ConfigError, GIB, KIB, MIB, Validator};

use super::Config;
use super::fabric_section::FabricConfig;
use super::targets::TargetConfig;
use super::transfer::TransferConfig;

impl Config {
    /// Checks every rule that needs no file access (see the field docs);
    /// `file` names the configuration file in errors.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the first offending field.
    pub fn validate(&self, file: &Path) -> Result<(), ConfigError> {
        let v = Validator::for_path(file);
        check_listen(&v, self)?;
        check_transfer(&v, &self.transfer)?;
        check_fabric(&v, &self.fabric)?;
        check_tenants(&v, self)?;
        check_shims(&v, self)?;
        check_targets(&v, &self.targets)?;
        check_hipobj_sizes(&v, self)?;
        check_metrics(&v, self)?;
        self.runtime
            .check()
            .map_err(|m| v.err("runtime.worker_threads", m))?;
        Ok(())
    }
}

/// A name: non-empty, no surrounding whitespace, no control characters.
fn check_name(v: &Validator, field: &str, name: &str) -> Check {
    if name.trim().is_empty() {
        return Err(v.err(field, "must not be empty"));
    }
    if name.trim() != name || name.chars().any(char::is_control) {
        return Err(v.err(
            field,
            format!("{name:?} must not have surrounding spaces or control characters"),
        ));
    }
    Ok(())
}

/// A bucket name in a grant or a target: `*` alone, or a name without `/`.
fn check_bucket(v: &Validator, field: &str, bucket: &str) -> Check {
    if bucket.is_empty() {
        return Err(v.err(field, "must not be empty (use \"*\" for every bucket)"));
    }
    if bucket.contains('/') {
        return Err(v.err(
            field,
            format!("{bucket:?} must be a bucket name, without '/' (put key prefixes in `prefix`)"),
        ));
    }
    if bucket != "*" && bucket.contains('*') {
        return Err(v.err(
            field,
            format!(
                "{bucket:?}: '*' is only allowed alone (every bucket); patterns are not supported"
            ),
        ));
    }
    if bucket.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(v.err(field, format!("{bucket:?} must not contain spaces")));
    }
    Ok(())
}

fn check_listen(v: &Validator, c: &Config) -> Check {
    let l = &c.listen;
    if let Some(tls) = &l.tls {
        v.non_empty_path("listen.tls.cert_file", &tls.cert_file)?;
        v.non_empty_path("listen.tls.key_file", &tls.key_file)?;
        v.non_empty_path("listen.tls.client_ca_file", &tls.client_ca_file)?;
    }
    v.between("listen.max_connections", l.max_connections as u64, 1, 65536)?;
    v.between(
        "listen.max_concurrent_streams",
        u64::from(l.max_concurrent_streams),
        1,
        65536,
    )?;
    v.size_between(
        "listen.max_header_list_size",
        l.max_header_list_size,
        KIB,
        MIB,
    )?;
    v.at_least(
        "listen.unauthenticated_timeout_secs",
        l.unauthenticated_timeout_secs,
        1,
    )?;
    v.at_least("listen.idle_timeout_secs", l.idle_timeout_secs, 1)?;
    Ok(())
}

fn check_transfer(v: &Validator, t: &TransferConfig) -> Check {
    // A token's size field is 8 hex digits (32 bits); 1GiB fits.
    v.size_between("transfer.chunk_size", t.chunk_size, 64 * KIB, GIB)?;
    if t.chunk_size.0 > u64::from(u32::MAX) {
        return Err(v.err(
            "transfer.chunk_size",
            "must fit the 32-bit size field of an RDMA token",
        ));
    }
    v.at_least(
        "transfer.max_chunks_in_flight",
        t.max_chunks_in_flight as u64,
        1,
    )?;
    v.size_between(
        "transfer.multipart_threshold",
        t.multipart_threshold,
        5 * MIB,
        5 * GIB,
    )?;
    v.size_between("transfer.part_size", t.part_size, 5 * MIB, 5 * GIB)?;
    v.at_least("transfer.backoff_initial_ms", t.backoff_initial_ms, 1)?;
    if t.backoff_max_ms < t.backoff_initial_ms {
        return Err(v.err(
            "transfer.backoff_max_ms",
            format!(
                "must be at least transfer.backoff_initial_ms ({}), got {}",
                t.backoff_initial_ms, t.backoff_max_ms
            ),
        ));
    }
    v.at_least("transfer.request_timeout_secs", t.request_timeout_secs, 1)?;
    v.at_least("transfer.attempt_timeout_secs", t.attempt_timeout_secs, 1)?;
    v.at_least("transfer.connect_timeout_ms", t.connect_timeout_ms, 1)?;
    v.at_least("transfer.batch_concurrency", t.batch_concurrency as u64, 1)?;
    v.between(
        "transfer.max_batch_items",
        t.max_batch_items as u64,
        1,
        65536,
    )?;
    v.between(
        "transfer.max_batch_bytes",
        t.max_batch_bytes.0,
        1 << 20,
        1 << 40,
    )?;
    Ok(())
}

fn check_fabric(v: &Validator, f: &FabricConfig) -> Check {
    v.non_empty_path("fabric.fabric_key_file", &f.fabric_key_file)?;
    let n = f.staging_buffers as u64;
    if !(1..=4096).contains(&n) {
        return Err(v.err(
            "fabric.staging_buffers",
            format!("must be between 1 and 4096, got {n}"),
        ));
    }
    v.size_between(
        "fabric.staging_buffer_size",
        f.staging_buffer_size,
        4 * KIB,
        256 * MIB,
    )?;
    if n.saturating_mul(f.staging_buffer_size.0) > 16 * GIB {
        return Err(v.err(
            "fabric.staging_buffer_size",
            format!(
                "fabric.staging_buffers x fabric.staging_buffer_size must not exceed 16GiB \
                 ({n} x {})",
                f.staging_buffer_size
            ),
        ));
    }
    v.at_least("fabric.connect_timeout_ms", f.connect_timeout_ms, 1)?;
    v.at_least(
        "fabric.max_ops_per_session",
        f.max_ops_per_session as u64,
        1,
    )?;
    v.at_least("fabric.idle_session_secs", f.idle_session_secs, 1)?;
    v.between(
        "fabric.tenant_staging_share_percent",
        u64::from(f.tenant_staging_share_percent),
        1,
        100,
    )?;
    Ok(())
}

/// Where each value of one field of a list's items stood last, to refuse
/// a repeat: `duplicate <what> "<value>" (also <list>[<j>])`.
struct Unique<'a> {
    list: &'static str,
    what: &'static str,
    seen: HashMap<&'a str, usize>,
}

impl<'a> Unique<'a> {
    fn new(list: &'static str, what: &'static str) -> Unique<'a> {
        Unique {
            list,
            what,
            seen: HashMap::new(),
        }
    }

    /// `value`, the `field` of item `i`, unless an earlier item had it.
    fn check(&mut self, v: &Validator, field: String, i: usize, value: &'a str) -> Check {
        match self.seen.insert(value, i) {
            Some(j) => Err(v.err(
                field,
                format!(
                    "duplicate {} {value:?} (also {}[{j}])",
                    self.what, self.list
                ),
            )),
            None => Ok(()),
        }
    }
}

fn check_tenants(v: &Validator, c: &Config) -> Check {
    if c.tenants.is_empty() {
        return Err(v.err("tenants", "at least one tenant is required"));
    }
    let mut names = Unique::new("tenants", "tenant name");
    let mut keys = Unique::new("tenants", "access key id");
    for (i, t) in c.tenants.iter().enumerate() {
        let at = |f: &str| format!("tenants[{i}].{f}");
        check_name(v, &at("name"), &t.name)?;
        names.check(v, at("name"), i, &t.name)?;
        if t.access_key_id.is_empty() {
            return Err(v.err(at("access_key_id"), "must not be empty"));
        }
        if !t.access_key_id.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(v.err(
                at("access_key_id"),
                "must be printable ASCII without spaces",
            ));
        }
        keys.check(v, at("access_key_id"), i, &t.access_key_id)?;
        v.non_empty_path(&at("secret_access_key_file"), &t.secret_access_key_file)?;
        for (j, g) in t.allow.iter().enumerate() {
            let ga = |f: &str| format!("tenants[{i}].allow[{j}].{f}");
            check_bucket(v, &ga("bucket"), &g.bucket)?;
            if !g.read && !g.write {
                return Err(v.err(
                    format!("tenants[{i}].allow[{j}]"),
                    "grants nothing: set read and/or write to true",
                ));
            }
        }
        let q = &t.quotas;
        v.at_least(
            &at("quotas.max_concurrent_requests"),
            q.max_concurrent_requests as u64,
            1,
        )?;
        let chunk = c.transfer.chunk_size;
        if q.max_bytes_in_flight < chunk {
            return Err(v.err(
                at("quotas.max_bytes_in_flight"),
                format!(
                    "{} is less than transfer.chunk_size ({chunk}): no chunk could ever \
                     start; set it to at least {chunk}",
                    q.max_bytes_in_flight
                ),
            ));
        }
        if let Some(bps) = q.max_bytes_per_second {
            v.at_least(&at("quotas.max_bytes_per_second"), bps.0, 1)?;
        }
    }
    Ok(())
}

fn check_shims(v: &Validator, c: &Config) -> Check {
    if c.shims.is_empty() {
        return Err(v.err("shims", "at least one shim is required"));
    }
    let mut names = Unique::new("shims", "shim name");
    let mut tls_names = Unique::new("shims", "tls_name");
    for (i, s) in c.shims.iter().enumerate() {
        let at = |f: &str| format!("shims[{i}].{f}");
        check_name(v, &at("name"), &s.name)?;
        names.check(v, at("name"), i, &s.name)?;
        if s.token_file.is_none() && s.tls_name.is_none() {
            return Err(v.err(
                format!("shims[{i}]"),
                "needs token_file or tls_name (or both) to authenticate",
            ));
        }
        if let Some(p) = &s.token_file {
            v.non_empty_path(&at("token_file"), p)?;
        }
        if let Some(n) = &s.tls_name {
            check_name(v, &at("tls_name"), n)?;
            if c.listen.tls.is_none() {
                return Err(v.err(
                    at("tls_name"),
                    "requires listen.tls (client certificates need TLS)",
                ));
            }
            tls_names.check(v, at("tls_name"), i, n)?;
        }
        if s.tenants.is_empty() {
            return Err(v.err(at("tenants"), "must name at least one tenant"));
        }
        for (j, t) in s.tenants.iter().enumerate() {
            if !c.tenants.iter().any(|ct| &ct.name == t) {
                return Err(v.err(
                    format!("shims[{i}].tenants[{j}]"),
                    format!("unknown tenant {t:?} (not in tenants)"),
                ));
            }
        }
    }
    Ok(())
}

fn check_targets(v: &Validator, targets: &[TargetConfig]) -> Check {
    if targets.is_empty() {
        return Err(v.err("targets", "at least one target is required"));
    }
    let mut names = Unique::new("targets", "target name");
    for (i, t) in targets.iter().enumerate() {
        let mut buckets: HashMap<&str, usize> = HashMap::new();
        let at = |f: &str| format!("targets[{i}].{f}");
        check_name(v, &at("name"), &t.name)?;
        names.check(v, at("name"), i, &t.name)?;
        let https = s3dma_config::check_endpoint_url(&t.endpoint)
            .map_err(|m| v.err(at("endpoint"), m))?
            .https;
        if t.region.trim().is_empty() {
            return Err(v.err(at("region"), "must not be empty"));
        }
        if t.region
            .chars()
            .any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(v.err(at("region"), "must not contain spaces"));
        }
        check_dialect(v, i, t)?;
        if let Some(ca) = &t.ca_file {
            if !https {
                return Err(v.err(at("ca_file"), "only allowed with an https:// endpoint"));
            }
            v.non_empty_path(&at("ca_file"), ca)?;
        }
        if t.buckets.is_empty() {
            return Err(v.err(
                at("buckets"),
                "must name at least one bucket, or \"*\" for every bucket",
            ));
        }
        for (j, b) in t.buckets.iter().enumerate() {
            let field = format!("targets[{i}].buckets[{j}]");
            check_bucket(v, &field, b)?;
            if let Some(k) = buckets.insert(b, j) {
                return Err(v.err(
                    field,
                    format!("{b:?} already listed by targets[{i}].buckets[{k}]"),
                ));
            }
        }
    }
    Ok(())
}

/// One hipobj-rc-v2 transfer moves at most 2^31 - 1 bytes: a single PUT
/// or a part must fit in one.
fn check_hipobj_sizes(v: &Validator, c: &Config) -> Check {
    use super::targets::RdmaProtocol;
    let Some(i) = c
        .targets
        .iter()
        .position(|t| t.rdma && t.protocol == RdmaProtocol::HipobjRcV2)
    else {
        return Ok(());
    };
    let max = s3dma_wire::hipobj::MAX_TRANSFER;
    for (field, size) in [
        (
            "transfer.multipart_threshold",
            c.transfer.multipart_threshold,
        ),
        ("transfer.part_size", c.transfer.part_size),
    ] {
        if size.0 > max {
            return Err(v.err(
                field,
                format!(
                    "must be at most {max} bytes (2 GiB - 1) with a hipobj-rc-v2 target (targets[{i}]): one transfer moves at most that"
                ),
            ));
        }
    }
    Ok(())
}

/// `protocol`, `token_header` and `multipart_parts`.
fn check_dialect(v: &Validator, i: usize, t: &TargetConfig) -> Check {
    use super::targets::{MultipartParts, RdmaProtocol};
    let at = |f: &str| format!("targets[{i}].{f}");
    let h = t.token_header.as_str();
    let well_formed = (3..=64).contains(&h.len())
        && h.starts_with("x-")
        && h.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !well_formed {
        return Err(v.err(
            at("token_header"),
            "must be a lowercase header name starting with x- (letters, digits, -; at most 64)",
        ));
    }
    if t.protocol == RdmaProtocol::S3dma && h != s3dma_wire::headers::RDMA_TOKEN {
        return Err(v.err(
            at("token_header"),
            "must be x-amz-rdma-token with protocol: s3dma (storage-targets read no other)",
        ));
    }
    if !t.rdma && t.multipart_parts == MultipartParts::Http {
        return Err(v.err(
            at("multipart_parts"),
            "http needs rdma: true (with rdma: false every byte goes over HTTP already); remove it",
        ));
    }
    Ok(())
}

fn check_metrics(v: &Validator, c: &Config) -> Check {
    if let Some(a) = c.metrics.address
        && a.port() != 0
        && a == c.listen.address
    {
        return Err(v.err("metrics.address", "must differ from listen.address"));
    }
    if let Some(p) = &c.metrics.unix_socket {
        v.non_empty_path("metrics.unix_socket", p)?;
    }
    if let Some(p) = &c.metrics.bearer_token_file {
        v.non_empty_path("metrics.bearer_token_file", p)?;
        if !c.metrics.serves() {
            return Err(v.err(
                "metrics.bearer_token_file",
                "protects nothing: set metrics.address and/or metrics.unix_socket",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::super::fixtures::{BASE, base, p, parse_err};
    use super::*;
    use crate::config::{ByteSize, TlsConfig, parse};

    #[test]
    fn worker_threads_are_checked() {
        assert_eq!(base().runtime.worker_threads, None);
        let e = parse_err(&format!("{BASE}runtime:\n  worker_threads: 2000\n"));
        assert!(
            e.contains("runtime.worker_threads: 2000 worker threads: must be 1 to 1024"),
            "{e}"
        );
        let c = parse(p(), &format!("{BASE}runtime:\n  worker_threads: 1\n")).unwrap();
        assert_eq!(c.runtime.worker_threads, Some(1));
    }
    #[test]
    fn gate_batch_share_and_metrics_fields_are_validated() {
        for (from, to, want) in [
            (
                "  address: 127.0.0.1:7000\n",
                "  address: 127.0.0.1:7000\n  max_connections: 0\n",
                "listen.max_connections: must be between 1 and 65536",
            ),
            (
                "  address: 127.0.0.1:7000\n",
                "  address: 127.0.0.1:7000\n  max_concurrent_streams: 0\n",
                "listen.max_concurrent_streams",
            ),
            (
                "  address: 127.0.0.1:7000\n",
                "  address: 127.0.0.1:7000\n  max_header_list_size: 100\n",
                "listen.max_header_list_size",
            ),
            (
                "  address: 127.0.0.1:7000\n",
                "  address: 127.0.0.1:7000\n  unauthenticated_timeout_secs: 0\n",
                "listen.unauthenticated_timeout_secs",
            ),
            (
                "  address: 127.0.0.1:7000\n",
                "  address: 127.0.0.1:7000\n  idle_timeout_secs: 0\n",
                "listen.idle_timeout_secs",
            ),
            (
                "fabric:\n",
                "transfer:\n  max_batch_items: 0\nfabric:\n",
                "transfer.max_batch_items",
            ),
            (
                "fabric:\n",
                "fabric:\n  tenant_staging_share_percent: 101\n",
                "fabric.tenant_staging_share_percent",
            ),
            (
                "fabric:\n",
                "metrics:\n  bearer_token_file: /etc/t\nfabric:\n",
                "metrics.bearer_token_file: protects nothing",
            ),
        ] {
            assert!(BASE.contains(from), "{from}");
            let e = parse_err(&BASE.replacen(from, to, 1));
            assert!(e.contains(want), "{to}: {e}");
        }
    }
    type Mutation = fn(&mut Config);

    /// Every validation rule: (field path expected in the message, a word of
    /// the message, the change that breaks the rule).
    const RULES: &[(&str, &str, Mutation)] = &[
        ("tenants:", "at least one", |c| c.tenants.clear()),
        ("shims:", "at least one", |c| c.shims.clear()),
        ("targets:", "at least one", |c| c.targets.clear()),
        ("tenants[1].name:", "duplicate", |c| {
            let mut t = c.tenants[0].clone();
            t.access_key_id = "OTHER".into();
            c.tenants.push(t);
        }),
        ("tenants[0].name:", "empty", |c| {
            c.tenants[0].name = " ".into()
        }),
        ("tenants[0].name:", "spaces", |c| {
            c.tenants[0].name = "alice ".into()
        }),
        ("tenants[1].access_key_id:", "duplicate", |c| {
            let mut t = c.tenants[0].clone();
            t.name = "bob".into();
            c.tenants.push(t);
        }),
        ("tenants[0].access_key_id:", "empty", |c| {
            c.tenants[0].access_key_id = String::new()
        }),
        ("tenants[0].access_key_id:", "printable", |c| {
            c.tenants[0].access_key_id = "AK ALICE".into()
        }),
        ("tenants[0].secret_access_key_file:", "empty", |c| {
            c.tenants[0].secret_access_key_file = PathBuf::new()
        }),
        ("tenants[0].allow[0].bucket:", "empty", |c| {
            c.tenants[0].allow[0].bucket = String::new()
        }),
        ("tenants[0].allow[0].bucket:", "'/'", |c| {
            c.tenants[0].allow[0].bucket = "alice-data/train".into()
        }),
        ("tenants[0].allow[0].bucket:", "patterns", |c| {
            c.tenants[0].allow[0].bucket = "alice-*".into()
        }),
        ("tenants[0].allow[0]:", "grants nothing", |c| {
            c.tenants[0].allow[0].read = false;
            c.tenants[0].allow[0].write = false;
        }),
        (
            "tenants[0].quotas.max_concurrent_requests:",
            "at least 1",
            |c| c.tenants[0].quotas.max_concurrent_requests = 0,
        ),
        (
            "tenants[0].quotas.max_bytes_in_flight:",
            "no chunk could ever start",
            |c| c.tenants[0].quotas.max_bytes_in_flight = ByteSize(4 << 20),
        ),
        (
            "tenants[0].quotas.max_bytes_per_second:",
            "at least 1",
            |c| c.tenants[0].quotas.max_bytes_per_second = Some(ByteSize(0)),
        ),
        ("shims[1].name:", "duplicate", |c| {
            let s = c.shims[0].clone();
            c.shims.push(s);
        }),
        ("shims[0].name:", "empty", |c| {
            c.shims[0].name = String::new()
        }),
        ("shims[0]:", "token_file or tls_name", |c| {
            c.shims[0].token_file = None
        }),
        ("shims[0].token_file:", "empty", |c| {
            c.shims[0].token_file = Some(PathBuf::new())
        }),
        ("shims[0].tls_name:", "requires listen.tls", |c| {
            c.shims[0].tls_name = Some("host1.example".into())
        }),
        ("shims[1].tls_name:", "duplicate", |c| {
            c.listen.tls = Some(tls());
            c.shims[0].tls_name = Some("host1.example".into());
            let mut s = c.shims[0].clone();
            s.name = "host2".into();
            s.token_file = None;
            c.shims.push(s);
        }),
        ("shims[0].tenants:", "at least one tenant", |c| {
            c.shims[0].tenants.clear()
        }),
        ("shims[0].tenants[1]:", "unknown tenant \"carol\"", |c| {
            c.shims[0].tenants.push("carol".into())
        }),
        ("targets[1].name:", "duplicate", |c| {
            let mut t = c.targets[0].clone();
            t.buckets = vec!["b".into()];
            c.targets.push(t);
        }),
        ("targets[0].endpoint:", "scheme", |c| {
            c.targets[0].endpoint = "127.0.0.1:9000".into()
        }),
        ("targets[0].endpoint:", "scheme", |c| {
            c.targets[0].endpoint = "ftp://127.0.0.1:9000".into()
        }),
        ("targets[0].endpoint:", "no path", |c| {
            c.targets[0].endpoint = "http://127.0.0.1:9000/s3".into()
        }),
        ("targets[0].endpoint:", "no query", |c| {
            c.targets[0].endpoint = "http://127.0.0.1:9000?x=1".into()
        }),
        ("targets[0].endpoint:", "no query", |c| {
            c.targets[0].endpoint = "http://127.0.0.1:9000/?x=1".into()
        }),
        ("targets[0].endpoint:", "no fragment", |c| {
            c.targets[0].endpoint = "http://h#f".into()
        }),
        ("targets[0].endpoint:", "no user info", |c| {
            c.targets[0].endpoint = "http://user:pw@h:9000".into()
        }),
        ("targets[0].endpoint:", "no spaces", |c| {
            c.targets[0].endpoint = "http://h :9000".into()
        }),
        ("targets[0].endpoint:", "host is missing", |c| {
            c.targets[0].endpoint = "http://".into()
        }),
        ("targets[0].endpoint:", "host is missing", |c| {
            c.targets[0].endpoint = "https://:443".into()
        }),
        ("targets[0].endpoint:", "port", |c| {
            c.targets[0].endpoint = "http://h:".into()
        }),
        ("targets[0].endpoint:", "port", |c| {
            c.targets[0].endpoint = "http://h:65536".into()
        }),
        ("targets[0].endpoint:", "port", |c| {
            c.targets[0].endpoint = "http://h:0".into()
        }),
        ("targets[0].endpoint:", "port", |c| {
            c.targets[0].endpoint = "http://h:+80".into()
        }),
        ("targets[0].endpoint:", "brackets", |c| {
            c.targets[0].endpoint = "http://::1:9000".into()
        }),
        ("targets[0].endpoint:", "IPv6", |c| {
            c.targets[0].endpoint = "http://[::g]:9000".into()
        }),
        ("targets[0].endpoint:", "unterminated", |c| {
            c.targets[0].endpoint = "http://[::1:9000".into()
        }),
        ("targets[0].endpoint:", "after ']'", |c| {
            c.targets[0].endpoint = "http://[::1]9000".into()
        }),
        ("targets[0].endpoint:", "host may only", |c| {
            c.targets[0].endpoint = "http://bad!host".into()
        }),
        // The one endpoint rule (shared with the shim's agent.endpoint):
        // the port is required.
        ("targets[0].endpoint:", "needs an explicit port", |c| {
            c.targets[0].endpoint = "https://s3.example.com".into()
        }),
        ("targets[0].endpoint:", "needs an explicit port", |c| {
            c.targets[0].endpoint = "http://[fe80::1]/".into()
        }),
        ("targets[0].token_header:", "lowercase", |c| {
            c.targets[0].protocol = crate::config::targets::RdmaProtocol::HipobjRcV2;
            c.targets[0].token_header = "X-Scal-Rdma".into()
        }),
        ("transfer.part_size:", "hipobj-rc-v2 target", |c| {
            c.targets[0].protocol = crate::config::targets::RdmaProtocol::HipobjRcV2;
            c.transfer.part_size = ByteSize(2 * GIB)
        }),
        ("targets[0].multipart_parts:", "needs rdma: true", |c| {
            c.targets[0].rdma = false;
            c.targets[0].multipart_parts = crate::config::targets::MultipartParts::Http
        }),
        ("targets[0].token_header:", "with protocol: s3dma", |c| {
            c.targets[0].token_header = "x-scal-rdma".into()
        }),
        ("targets[0].region:", "empty", |c| {
            c.targets[0].region = String::new()
        }),
        ("targets[0].region:", "spaces", |c| {
            c.targets[0].region = "us east".into()
        }),
        ("targets[0].ca_file:", "https", |c| {
            c.targets[0].ca_file = Some("/etc/s3dma/ca.pem".into())
        }),
        ("targets[0].buckets:", "at least one", |c| {
            c.targets[0].buckets.clear()
        }),
        ("targets[0].buckets[0]:", "empty", |c| {
            c.targets[0].buckets = vec![String::new()]
        }),
        ("targets[0].buckets[0]:", "'/'", |c| {
            c.targets[0].buckets = vec!["a/b".into()]
        }),
        (
            "targets[0].buckets[1]:",
            "already listed by targets[0].buckets[0]",
            |c| c.targets[0].buckets = vec!["a".into(), "a".into()],
        ),
        ("fabric.fabric_key_file:", "empty", |c| {
            c.fabric.fabric_key_file = PathBuf::new()
        }),
        ("fabric.staging_buffers:", "between 1 and 4096", |c| {
            c.fabric.staging_buffers = 0
        }),
        ("fabric.staging_buffers:", "between 1 and 4096", |c| {
            c.fabric.staging_buffers = 4097
        }),
        (
            "fabric.staging_buffer_size:",
            "between 4KiB and 256MiB",
            |c| c.fabric.staging_buffer_size = ByteSize(4095),
        ),
        (
            "fabric.staging_buffer_size:",
            "between 4KiB and 256MiB",
            |c| c.fabric.staging_buffer_size = ByteSize(256 * MIB + 1),
        ),
        ("fabric.staging_buffer_size:", "16GiB", |c| {
            c.fabric.staging_buffers = 4096;
            c.fabric.staging_buffer_size = ByteSize(256 * MIB);
        }),
        ("fabric.connect_timeout_ms:", "at least 1", |c| {
            c.fabric.connect_timeout_ms = 0
        }),
        ("fabric.max_ops_per_session:", "at least 1", |c| {
            c.fabric.max_ops_per_session = 0
        }),
        ("fabric.idle_session_secs:", "at least 1", |c| {
            c.fabric.idle_session_secs = 0
        }),
        ("transfer.chunk_size:", "between 64KiB and 1GiB", |c| {
            c.transfer.chunk_size = ByteSize(64 * KIB - 1)
        }),
        ("transfer.chunk_size:", "between 64KiB and 1GiB", |c| {
            c.transfer.chunk_size = ByteSize(4 * GIB)
        }),
        ("transfer.max_chunks_in_flight:", "at least 1", |c| {
            c.transfer.max_chunks_in_flight = 0
        }),
        (
            "transfer.multipart_threshold:",
            "between 5MiB and 5GiB",
            |c| c.transfer.multipart_threshold = ByteSize(4 * MIB),
        ),
        (
            "transfer.multipart_threshold:",
            "between 5MiB and 5GiB",
            |c| c.transfer.multipart_threshold = ByteSize(5 * GIB + 1),
        ),
        ("transfer.part_size:", "between 5MiB and 5GiB", |c| {
            c.transfer.part_size = ByteSize(5 * MIB - 1)
        }),
        ("transfer.part_size:", "between 5MiB and 5GiB", |c| {
            c.transfer.part_size = ByteSize(6 * GIB)
        }),
        ("transfer.backoff_initial_ms:", "at least 1", |c| {
            c.transfer.backoff_initial_ms = 0
        }),
        ("transfer.backoff_max_ms:", "backoff_initial_ms", |c| {
            c.transfer.backoff_initial_ms = 100;
            c.transfer.backoff_max_ms = 99;
        }),
        ("transfer.request_timeout_secs:", "at least 1", |c| {
            c.transfer.request_timeout_secs = 0
        }),
        ("transfer.attempt_timeout_secs:", "at least 1", |c| {
            c.transfer.attempt_timeout_secs = 0
        }),
        ("transfer.connect_timeout_ms:", "at least 1", |c| {
            c.transfer.connect_timeout_ms = 0
        }),
        ("transfer.batch_concurrency:", "at least 1", |c| {
            c.transfer.batch_concurrency = 0
        }),
        ("listen.tls.cert_file:", "empty", |c| {
            let mut t = tls();
            t.cert_file = PathBuf::new();
            c.listen.tls = Some(t);
        }),
        ("listen.tls.key_file:", "empty", |c| {
            let mut t = tls();
            t.key_file = PathBuf::new();
            c.listen.tls = Some(t);
        }),
        ("listen.tls.client_ca_file:", "empty", |c| {
            let mut t = tls();
            t.client_ca_file = PathBuf::new();
            c.listen.tls = Some(t);
        }),
        ("metrics.address:", "differ", |c| {
            c.metrics.address = Some(c.listen.address)
        }),
    ];

    fn tls() -> TlsConfig {
        TlsConfig {
            cert_file: "/etc/s3dma/agent.crt".into(),
            key_file: "/etc/s3dma/agent.key".into(),
            client_ca_file: "/etc/s3dma/shim-ca.pem".into(),
        }
    }

    #[test]
    fn every_validation_rule_names_the_field() {
        base().validate(p()).unwrap();
        for (i, (field, word, mutate)) in RULES.iter().enumerate() {
            let mut c = base();
            mutate(&mut c);
            let e = c
                .validate(p())
                .expect_err(&format!("rule #{i} ({field} {word}) accepted"));
            let m = e.to_string();
            assert!(
                m.starts_with(&format!("/etc/s3dma/agent.yaml: {field} ")),
                "rule #{i}: want field {field}, got: {m}"
            );
            assert!(m.contains(word), "rule #{i}: want {word:?} in: {m}");
            assert_eq!(
                e.field(),
                Some(field.trim_end_matches(':')),
                "rule #{i}: {m}"
            );
        }
    }

    #[test]
    fn accepted_edge_values() {
        let ok: &[Mutation] = &[
            |c| c.targets[0].endpoint = "http://127.0.0.1:9000/".into(),
            |c| c.targets[0].endpoint = "https://s3.example.com:443".into(),
            |c| c.targets[0].endpoint = "http://[::1]:9000".into(),
            |c| c.targets[0].endpoint = "http://[fe80::1]:80".into(),
            |c| c.targets[0].endpoint = "http://my_host.local:65535".into(),
            |c| {
                c.targets[0].endpoint = "https://s3.example.com:8443/".into();
                c.targets[0].ca_file = Some("/etc/s3dma/ca.pem".into());
            },
            |c| {
                c.listen.tls = Some(tls());
                c.shims[0].tls_name = Some("host1.example".into());
                c.shims[0].token_file = None;
            },
            |c| c.transfer.chunk_size = ByteSize(64 * KIB),
            |c| {
                c.transfer.chunk_size = ByteSize(GIB);
                c.tenants[0].quotas.max_bytes_in_flight = ByteSize(GIB);
            },
            |c| c.transfer.part_size = ByteSize(5 * GIB),
            |c| c.transfer.multipart_threshold = ByteSize(5 * MIB),
            |c| c.transfer.retries = 0,
            |c| c.transfer.backoff_max_ms = c.transfer.backoff_initial_ms,
            |c| c.tenants[0].quotas.max_queued_requests = 0,
            |c| c.tenants[0].quotas.max_bytes_in_flight = ByteSize(8 * MIB),
            |c| c.tenants[0].quotas.max_bytes_per_second = Some(ByteSize(1)),
            |c| c.tenants[0].allow.clear(),
            |c| {
                c.tenants[0].allow[0].read = false;
                c.tenants[0].allow[0].bucket = "*".into();
            },
            |c| c.targets[0].max_idle_connections = 0,
            |c| {
                c.fabric.staging_buffers = 4096;
                c.fabric.staging_buffer_size = ByteSize(4 * MIB);
            },
            |c| {
                c.listen.address = "127.0.0.1:0".parse().unwrap();
                c.metrics.address = Some("127.0.0.1:0".parse().unwrap());
            },
            |c| c.metrics.address = Some("127.0.0.1:9102".parse().unwrap()),
        ];
        for (i, mutate) in ok.iter().enumerate() {
            let mut c = base();
            mutate(&mut c);
            if let Err(e) = c.validate(p()) {
                panic!("edge case #{i} rejected: {e}");
            }
        }
    }

    #[test]
    fn parse_runs_validation() {
        let e = parse_err(&BASE.replace("tenants: [alice]", "tenants: [carol]"));
        assert_eq!(
            e,
            "/etc/s3dma/agent.yaml: shims[0].tenants[0]: unknown tenant \"carol\" (not in tenants)"
        );
        let e = parse_err(
            &(BASE.to_owned() + "transfer:\n  chunk_size: 16MiB\n").replace(
                "        write: true",
                "        write: true\n    quotas:\n      max_bytes_in_flight: 8MiB",
            ),
        );
        assert!(
            e.starts_with("/etc/s3dma/agent.yaml: tenants[0].quotas.max_bytes_in_flight: 8MiB is less than transfer.chunk_size (16MiB)"),
            "{e}"
        );
    }
}
