//! dpu-agent processes and their configuration.

use std::net::SocketAddr;

use s3dma_proto::agent::v1::agent_client::AgentClient;
use tonic::transport::Channel;

use super::*;

/// A target entry of the agent's config.
#[derive(Debug)]
pub struct TargetSpec {
    /// The target's name.
    pub name: &'static str,
    /// Its S3 endpoint.
    pub endpoint: String,
    /// The buckets it serves (`"*"` for every other bucket).
    pub buckets: Vec<&'static str>,
    /// Whether requests to it carry RDMA tokens.
    pub rdma: bool,
}

/// Knobs of a test agent.
#[derive(Debug)]
pub struct AgentSpec {
    /// The targets.
    pub targets: Vec<TargetSpec>,
    /// Extra YAML under `transfer:`.
    pub transfer: String,
    /// Extra YAML under alice's `quotas:`.
    pub alice_quotas: String,
    /// `RUST_LOG` of the agent.
    pub rust_log: &'static str,
    /// `listen.address` (a fixed port survives restarts).
    pub listen: String,
    /// Command prefix the binary runs under (e.g. `ip netns exec NAME`;
    /// it must exec the binary). Default: none.
    pub wrap: Vec<String>,
    /// More buckets a tenant (`alice` or `bob`) may read and write, beyond
    /// `alice-data`, `shared` and `bob-data`.
    pub extra_buckets: Vec<(&'static str, &'static str)>,
    /// Extra YAML over every target entry (e.g. `protocol: hipobj-rc-v2`).
    pub target_yaml: String,
}

impl AgentSpec {
    /// An agent for `targets` with the test defaults.
    pub fn new(targets: Vec<TargetSpec>) -> AgentSpec {
        AgentSpec {
            targets,
            transfer: String::new(),
            alice_quotas: String::new(),
            rust_log: "info",
            listen: "127.0.0.1:0".into(),
            wrap: Vec::new(),
            extra_buckets: Vec::new(),
            target_yaml: String::new(),
        }
    }

    /// An agent for the one target `t`, serving every bucket over RDMA.
    pub fn one(t: &Target) -> AgentSpec {
        AgentSpec::new(vec![TargetSpec {
            name: "local",
            endpoint: t.endpoint.clone(),
            buckets: vec!["*"],
            rdma: true,
        }])
    }
}

/// The agent's configuration for `spec`, with its secret files in `d`:
/// shims `host1` (alice and bob) and `host2` (bob), tenants alice
/// (read-write `alice-data` and `shared`) and bob (read-write `bob-data`,
/// read `shared/datasets/`), a small staging pool, the test transfer
/// defaults (`request_timeout_secs: 120`, `backoff_initial_ms: 20`,
/// `backoff_max_ms: 200`) under `spec.transfer`, metrics on loopback.
fn agent_config(spec: &AgentSpec, d: &Path) -> dpu_agent::config::Config {
    use dpu_agent::config::{
        ByteSize, Config, FabricConfig, Grant, ListenConfig, MetricsConfig, Quotas, ShimConfig,
        TargetConfig, TenantConfig, TransferConfig,
    };
    let grant = |bucket: &str, prefix: &str, write: bool| Grant {
        bucket: bucket.into(),
        prefix: prefix.into(),
        read: true,
        write,
    };
    let extra = |tenant: &str| {
        spec.extra_buckets
            .iter()
            .filter(|(t, _)| *t == tenant)
            .map(|(_, b)| grant(b, "", true))
            .collect::<Vec<_>>()
    };
    let shim = |name: &str, token: &str, tenants: &[&str]| ShimConfig {
        name: name.into(),
        token_file: Some(d.join(token)),
        tls_name: None,
        tenants: tenants.iter().map(|t| (*t).to_owned()).collect(),
    };
    let transfer = TransferConfig {
        request_timeout_secs: 120,
        backoff_initial_ms: 20,
        backoff_max_ms: 200,
        ..TransferConfig::default()
    };
    let mut fabric = FabricConfig::new(d.join("fabric.key"));
    fabric.backend = backend();
    fabric.staging_buffers = 16;
    fabric.staging_buffer_size = ByteSize(1 << 20);
    Config {
        listen: ListenConfig::new(spec.listen.parse().unwrap()),
        shims: vec![
            shim("host1", "shim.token", &["alice", "bob"]),
            shim("host2", "other-shim.token", &["bob"]),
        ],
        tenants: vec![
            TenantConfig {
                name: "alice".into(),
                access_key_id: ALICE.0.into(),
                secret_access_key_file: d.join("alice.secret"),
                allow: [grant("alice-data", "", true), grant("shared", "", true)]
                    .into_iter()
                    .chain(extra("alice"))
                    .collect(),
                quotas: overlay(&Quotas::default(), &spec.alice_quotas),
            },
            TenantConfig {
                name: "bob".into(),
                access_key_id: BOB.0.into(),
                secret_access_key_file: d.join("bob.secret"),
                allow: [
                    grant("bob-data", "", true),
                    grant("shared", "datasets/", false),
                ]
                .into_iter()
                .chain(extra("bob"))
                .collect(),
                quotas: Quotas::default(),
            },
        ],
        targets: spec
            .targets
            .iter()
            .map(|t| {
                let mut c = TargetConfig::new(
                    t.name,
                    t.endpoint.clone(),
                    t.buckets.iter().map(|b| (*b).to_owned()).collect(),
                );
                c.rdma = t.rdma;
                overlay(&c, &spec.target_yaml)
            })
            .collect(),
        fabric,
        transfer: overlay(&transfer, &spec.transfer),
        metrics: MetricsConfig {
            address: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
            ..MetricsConfig::default()
        },
        runtime: s3dma_config::RuntimeConfig::default(),
    }
}

/// A dpu-agent process.
#[derive(Debug)]
pub struct Agent {
    svc: Service,
    /// The gRPC address, `IP:PORT`.
    pub addr: String,
    /// `http://IP:PORT/metrics`.
    pub metrics: String,
    /// Its temporary directory: config, secrets, logs.
    pub dir: tempfile::TempDir,
    /// Its configuration file.
    pub config: PathBuf,
}

impl Agent {
    /// Writes the config and secrets for `spec` and starts the agent.
    pub fn start(spec: AgentSpec) -> Agent {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        write_private(&p.join("fabric.key"), FABRIC_KEY_HEX);
        write_private(&p.join("alice.secret"), ALICE.1);
        write_private(&p.join("bob.secret"), BOB.1);
        write_private(&p.join("shim.token"), SHIM_TOKEN);
        write_private(&p.join("other-shim.token"), "other-shim-token-abcdef0123");
        let cfg = agent_config(&spec, p);
        let config = p.join("agent.yaml");
        crate::configs::write(&config, &cfg).unwrap();
        let mut svc = ServiceSpec::new(
            "dpu-agent",
            bin_dir().join("dpu-agent"),
            config.clone(),
            p.join("agent.log"),
            &["dpu-agent listening on ", "metrics on "],
        )
        .env("RUST_LOG", spec.rust_log);
        svc.stdout_log = Some(p.join("agent.stdout"));
        svc.wrap = spec.wrap;
        let mut a = Agent {
            svc: Service::start(svc),
            addr: String::new(),
            metrics: String::new(),
            dir,
            config,
        };
        a.started();
        a
    }

    fn started(&mut self) {
        self.addr = self.svc.line(0).to_owned();
        self.metrics = self.svc.line(1).to_owned();
    }

    /// The process id.
    ///
    /// # Panics
    /// While it is killed.
    pub fn pid(&self) -> u32 {
        self.svc.pid().expect("the agent is not running")
    }

    /// stderr and stdout so far.
    pub fn output(&self) -> String {
        let out = self.svc.spec.stdout_log.as_deref().map(read_log);
        self.svc.log() + &out.unwrap_or_default()
    }

    /// The `/metrics` text.
    pub async fn metrics_text(&self) -> String {
        scrape(&self.metrics).await
    }

    /// A test shim with the right token (`host1`).
    pub async fn client(&self) -> Shim {
        self.client_with(SHIM_TOKEN).await
    }

    /// A test shim sending `token`.
    pub async fn client_with(&self, token: &str) -> Shim {
        Agent::shim_for(&self.addr, token).await
    }

    /// A shim on its own connection to the agent at `addr` (`IP:PORT`)
    /// with bearer `token` (none when empty).
    ///
    /// The connection opens at the first call: the agent closes one that
    /// has not authenticated within `listen.unauthenticated_timeout_secs`
    /// (10 s), and a test that prepares for longer than that before its
    /// first call (128 MiB of data under the VM's emulated CPUs) would
    /// otherwise write it into a connection the agent had just closed.
    pub async fn shim_for(addr: &str, token: &str) -> Shim {
        let ch = Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect_lazy();
        Shim {
            inner: AgentClient::new(ch).max_decoding_message_size(64 << 20),
            token: token.to_owned(),
        }
    }

    /// SIGKILLs the agent (and reaps it).
    pub fn kill9(&mut self) {
        self.svc.kill9();
    }

    /// SIGKILL, then the same configuration again (the same address when
    /// `listen` was a fixed port).
    pub fn restart(&mut self) {
        self.svc.restart();
        self.started();
    }
}
