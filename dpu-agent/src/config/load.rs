//! The loaded form: the configuration validated, its secret files read and
//! the files it names checked ([`load`]).

use std::path::{Path, PathBuf};

use fabric::FabricKey;
use s3dma_config::{ConfigError, Secret, Validator};

use super::tenants::{Grant, Quotas};
use super::{Config, parse};

/// A validated configuration with its secrets read. `Debug` never shows a
/// secret.
#[derive(Debug, Clone)]
pub struct LoadedConfig {
    /// The configuration file it was loaded from.
    pub path: PathBuf,
    /// The file as parsed (holds secret file paths, not secrets).
    pub config: Config,
    /// The tenants with their secrets, in the order of `config.tenants`.
    pub tenants: Vec<LoadedTenant>,
    /// The shims with their tokens, in the order of `config.shims`.
    pub shims: Vec<LoadedShim>,
    /// The decoded fabric key (at least 16 bytes; `Debug` shows only its
    /// length).
    pub fabric_key: FabricKey,
    /// The metrics bearer token (`metrics.bearer_token_file`), if any.
    pub metrics_token: Option<Secret>,
}

impl LoadedConfig {
    /// The tenant named `name`.
    #[must_use]
    pub fn tenant(&self, name: &str) -> Option<&LoadedTenant> {
        self.tenants.iter().find(|t| t.name == name)
    }

    /// The shim named `name`.
    #[must_use]
    pub fn shim(&self, name: &str) -> Option<&LoadedShim> {
        self.shims.iter().find(|s| s.name == name)
    }
}

/// A tenant with its secret access key read.
#[derive(Debug, Clone)]
pub struct LoadedTenant {
    /// Tenant name.
    pub name: String,
    /// S3 access key id.
    pub access_key_id: String,
    /// S3 secret access key (trimmed, non-empty).
    pub secret_access_key: Secret,
    /// The tenant's grants, in configuration order.
    pub allow: Vec<Grant>,
    /// The tenant's quotas.
    pub quotas: Quotas,
}

/// A shim with its bearer token read.
#[derive(Debug, Clone)]
pub struct LoadedShim {
    /// Shim name.
    pub name: String,
    /// Bearer token (trimmed, at least 16 printable ASCII characters), when
    /// `token_file` is set.
    pub token: Option<Secret>,
    /// Name its client certificate must carry, when set.
    pub tls_name: Option<String>,
    /// Tenants it may act for.
    pub tenants: Vec<String>,
}

/// Reads, parses and validates the configuration file at `path`, reads the
/// secret files it names and checks that its TLS/CA files can be opened.
///
/// # Errors
/// A [`ConfigError`] naming the file, the field and what is wrong.
pub fn load(path: &Path) -> Result<LoadedConfig, ConfigError> {
    let (file, text) = s3dma_service::skeleton::read_config(path)?;
    let config = parse(path, &text)?;
    let v = Validator::new(file);

    if let Some(tls) = &config.listen.tls {
        v.readable("listen.tls.cert_file", &tls.cert_file)?;
        v.readable("listen.tls.key_file", &tls.key_file)?;
        v.readable("listen.tls.client_ca_file", &tls.client_ca_file)?;
    }
    for (i, t) in config.targets.iter().enumerate() {
        if let Some(ca) = &t.ca_file {
            v.readable(&format!("targets[{i}].ca_file"), ca)?;
        }
    }

    let mut tenants = Vec::with_capacity(config.tenants.len());
    for (i, t) in config.tenants.iter().enumerate() {
        let field = format!("tenants[{i}].secret_access_key_file");
        let secret = v.read_secret(&field, &t.secret_access_key_file)?;
        tenants.push(LoadedTenant {
            name: t.name.clone(),
            access_key_id: t.access_key_id.clone(),
            secret_access_key: secret,
            allow: t.allow.clone(),
            quotas: t.quotas.clone(),
        });
    }

    let mut shims: Vec<LoadedShim> = Vec::with_capacity(config.shims.len());
    for (i, s) in config.shims.iter().enumerate() {
        let token = match &s.token_file {
            None => None,
            Some(p) => {
                let field = format!("shims[{i}].token_file");
                let token = v.read_secret(&field, p)?;
                let t = token.expose();
                if !t.bytes().all(|b| b.is_ascii_graphic()) {
                    return Err(v.err(
                        field,
                        format!(
                            "the token in {} must be printable ASCII without spaces",
                            p.display()
                        ),
                    ));
                }
                if t.len() < 16 {
                    return Err(v.err(
                        field,
                        format!(
                            "the token in {} is {} characters long; at least 16 are required \
                             (e.g. `openssl rand -hex 32`)",
                            p.display(),
                            t.len()
                        ),
                    ));
                }
                if let Some((j, other)) = shims.iter().enumerate().find(|(_, o)| {
                    o.token
                        .as_ref()
                        .is_some_and(|o| o.expose().as_bytes() == t.as_bytes())
                }) {
                    return Err(v.err(
                        field,
                        format!(
                            "the token in {} is the same as shims[{j}]'s ({:?}); every shim \
                             needs its own token",
                            p.display(),
                            other.name
                        ),
                    ));
                }
                Some(token)
            }
        };
        shims.push(LoadedShim {
            name: s.name.clone(),
            token,
            tls_name: s.tls_name.clone(),
            tenants: s.tenants.clone(),
        });
    }

    // `cannot read <path>: ...` or `<path>: <what is wrong>`, never the key.
    let fabric_key = fabric::config::read_fabric_key_file(&config.fabric.fabric_key_file)
        .map_err(|m| v.err("fabric.fabric_key_file", m))?;

    let metrics_token = match &config.metrics.bearer_token_file {
        None => None,
        Some(p) => {
            let field = "metrics.bearer_token_file";
            let token = v.read_secret(field, p)?;
            let t = token.expose();
            if t.len() < 16 || !t.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(v.err(
                    field,
                    format!(
                        "the token in {} must be at least 16 printable ASCII characters \
                         without spaces (e.g. `openssl rand -hex 32`)",
                        p.display()
                    ),
                ));
            }
            Some(token)
        }
    };

    Ok(LoadedConfig {
        path: path.to_path_buf(),
        config,
        tenants,
        shims,
        fabric_key,
        metrics_token,
    })
}
#[cfg(test)]
mod tests {
    use super::*;

    const ALICE_SECRET: &str = "alice-SECRET-wJalrXUtnFEMI";
    const BOB_SECRET: &str = "bob-SECRET-K7MDENGbPxRfiCY";
    const HOST1_TOKEN: &str = "host1-TOKEN-0123456789abcdef";
    const FABRIC_KEY: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

    struct Files {
        dir: tempfile::TempDir,
    }

    impl Files {
        fn new() -> Files {
            let f = Files {
                dir: tempfile::tempdir().unwrap(),
            };
            f.write("alice.secret", &format!("{ALICE_SECRET}\n"));
            f.write("bob.secret", &format!("  {BOB_SECRET}\r\n"));
            f.write("host1.token", &format!("{HOST1_TOKEN}\n"));
            f.write("fabric.key", &format!("{FABRIC_KEY}\n"));
            f
        }

        fn path(&self, name: &str) -> PathBuf {
            self.dir.path().join(name)
        }

        /// Writes `name` mode 0600, as secret files must be.
        fn write(&self, name: &str, content: &str) {
            use std::os::unix::fs::PermissionsExt as _;
            let p = self.path(name);
            std::fs::write(&p, content).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        }

        /// Writes the agent config and returns its path.
        fn config(&self, extra_shim: &str) -> PathBuf {
            let d = self.dir.path().display();
            let text = format!(
                "\
listen:
  address: 127.0.0.1:7000
shims:
  - name: host1
    token_file: {d}/host1.token
    tenants: [alice, bob]
{extra_shim}
tenants:
  - name: alice
    access_key_id: AKALICE
    secret_access_key_file: {d}/alice.secret
    allow:
      - bucket: alice-data
        write: true
  - name: bob
    access_key_id: AKBOB
    secret_access_key_file: {d}/bob.secret
    allow:
      - bucket: shared
        prefix: datasets/
targets:
  - name: local
    endpoint: http://127.0.0.1:9000
    buckets: [\"*\"]
fabric:
  fabric_key_file: {d}/fabric.key
"
            );
            self.write("agent.yaml", &text);
            self.path("agent.yaml")
        }
    }

    #[test]
    fn load_reads_secrets() {
        let f = Files::new();
        let path = f.config("");
        let l = load(&path).unwrap();
        assert_eq!(l.path, path);
        assert_eq!(l.tenants.len(), 2);
        assert_eq!(l.tenants[0].name, "alice");
        assert_eq!(l.tenants[0].access_key_id, "AKALICE");
        assert_eq!(l.tenants[0].secret_access_key.expose(), ALICE_SECRET);
        assert_eq!(l.tenants[1].secret_access_key.expose(), BOB_SECRET);
        assert_eq!(l.tenants[1].allow, l.config.tenants[1].allow);
        assert_eq!(l.tenants[1].quotas, Quotas::default());
        assert_eq!(l.shims.len(), 1);
        assert_eq!(l.shims[0].token.as_ref().unwrap().expose(), HOST1_TOKEN);
        assert_eq!(l.shims[0].tenants, ["alice", "bob"]);
        assert_eq!(
            l.fabric_key,
            FabricKey::new(hex::decode(FABRIC_KEY).unwrap()).unwrap()
        );
        assert_eq!(l.tenant("bob").unwrap().access_key_id, "AKBOB");
        assert!(l.tenant("carol").is_none());
        assert_eq!(l.shim("host1").unwrap().name, "host1");
        assert!(l.shim("host2").is_none());
    }

    #[test]
    fn debug_never_shows_secrets() {
        let f = Files::new();
        let l = load(&f.config("")).unwrap();
        let dbg = format!("{l:?}");
        let pretty = format!("{l:#?}");
        for s in [ALICE_SECRET, BOB_SECRET, HOST1_TOKEN, FABRIC_KEY] {
            assert!(!dbg.contains(s), "{s} in {dbg}");
            assert!(!pretty.contains(s), "{s} in {pretty}");
        }
        assert!(!dbg.contains("0, 17, 34, 51"), "fabric key bytes in {dbg}");
        assert!(dbg.contains("<redacted>"));
        assert_eq!(format!("{:?}", Secret::new("x".into())), "<redacted>");
        assert!(dbg.contains("FabricKey(<32 bytes redacted>)"), "{dbg}");
    }

    #[test]
    fn missing_secret_file_names_field_and_path() {
        let f = Files::new();
        let path = f.config("");
        std::fs::remove_file(f.path("bob.secret")).unwrap();
        let e = load(&path).unwrap_err().to_string();
        let want = format!(
            "{}: tenants[1].secret_access_key_file: cannot read {}",
            path.display(),
            f.path("bob.secret").display()
        );
        assert!(e.starts_with(&want), "{e}");
    }

    #[test]
    fn secret_file_problems() {
        let cases: &[(&str, &str, &str, &str)] = &[
            (
                "alice.secret",
                " \n",
                "tenants[0].secret_access_key_file",
                "is empty",
            ),
            ("host1.token", "\n", "shims[0].token_file", "is empty"),
            (
                "host1.token",
                "short-token-15c\n",
                "shims[0].token_file",
                "15 characters",
            ),
            (
                "host1.token",
                "has a space inside the token\n",
                "shims[0].token_file",
                "printable ASCII",
            ),
            ("fabric.key", "", "fabric.fabric_key_file", "empty"),
            (
                "fabric.key",
                "00112233445566778899aabbccddeeff0",
                "fabric.fabric_key_file",
                "odd",
            ),
            (
                "fabric.key",
                "00112233445566778899aabbccddee",
                "fabric.fabric_key_file",
                "30 hex digits",
            ),
            (
                "fabric.key",
                "zz112233445566778899aabbccddeeff",
                "fabric.fabric_key_file",
                "not hexadecimal",
            ),
        ];
        for (file, content, field, word) in cases {
            let f = Files::new();
            let path = f.config("");
            f.write(file, content);
            let e = load(&path).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("{}: {field}: ", path.display())),
                "{file}: {e}"
            );
            assert!(e.contains(word), "{file}: want {word:?} in {e}");
            assert!(e.contains(&f.path(file).display().to_string()), "{e}");
            if !content.trim().is_empty() {
                assert!(!e.contains(content.trim()), "content leaked: {e}");
            }
        }
        // A 32-digit key is the minimum.
        let f = Files::new();
        let path = f.config("");
        f.write("fabric.key", "  00112233445566778899AABBCCDDEEFF  \n");
        assert_eq!(
            load(&path).unwrap().fabric_key,
            FabricKey::new(hex::decode("00112233445566778899aabbccddeeff").unwrap()).unwrap()
        );
    }

    #[test]
    fn shims_need_distinct_tokens() {
        let f = Files::new();
        let d = f.dir.path().display().to_string();
        f.write("host2.token", &format!("{HOST1_TOKEN}\n"));
        let path = f.config(&format!(
            "  - name: host2\n    token_file: {d}/host2.token\n    tenants: [bob]\n"
        ));
        let e = load(&path).unwrap_err().to_string();
        assert!(e.contains("shims[1].token_file: "), "{e}");
        assert!(e.contains("same as shims[0]'s"), "{e}");
        assert!(!e.contains(HOST1_TOKEN), "{e}");
        f.write("host2.token", "host2-TOKEN-0123456789abcdef");
        let l = load(&path).unwrap();
        assert_eq!(l.shims[1].tenants, ["bob"]);
    }

    #[test]
    fn load_checks_tls_and_ca_files() {
        let f = Files::new();
        let d = f.dir.path().display().to_string();
        let path = f.config("");
        let text = std::fs::read_to_string(&path).unwrap().replace(
            "  address: 127.0.0.1:7000\n",
            &format!(
                "  address: 127.0.0.1:7000\n  tls:\n    cert_file: {d}/agent.crt\n    \
                 key_file: {d}/agent.key\n    client_ca_file: {d}/ca.pem\n"
            ),
        );
        std::fs::write(&path, text).unwrap();
        let e = load(&path).unwrap_err().to_string();
        assert!(e.contains("listen.tls.cert_file: cannot read"), "{e}");
        assert!(e.contains(&format!("{d}/agent.crt")), "{e}");
        f.write("agent.crt", "pem");
        f.write("agent.key", "pem");
        let e = load(&path).unwrap_err().to_string();
        assert!(e.contains("listen.tls.client_ca_file: cannot read"), "{e}");
        std::fs::create_dir(f.path("ca.pem")).unwrap();
        let e = load(&path).unwrap_err().to_string();
        assert!(
            e.contains("listen.tls.client_ca_file: ") && e.contains("not a regular file"),
            "{e}"
        );
        std::fs::remove_dir(f.path("ca.pem")).unwrap();
        f.write("ca.pem", "pem");
        load(&path).unwrap();

        let text = std::fs::read_to_string(&path).unwrap().replace(
            "    endpoint: http://127.0.0.1:9000\n",
            &format!("    endpoint: https://s3.local:9443\n    ca_file: {d}/target-ca.pem\n"),
        );
        std::fs::write(&path, text).unwrap();
        let e = load(&path).unwrap_err().to_string();
        assert!(e.contains("targets[0].ca_file: cannot read"), "{e}");
        f.write("target-ca.pem", "pem");
        load(&path).unwrap();
    }

    #[test]
    fn missing_config_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nope.yaml");
        let e = load(&path).unwrap_err();
        assert!(matches!(e, ConfigError::Read { .. }));
        assert!(
            e.to_string()
                .starts_with(&format!("{}: cannot read: ", path.display()))
        );
    }
}
