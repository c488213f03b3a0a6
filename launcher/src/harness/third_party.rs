//! Third-party S3 servers: moto (from the test virtualenv) and a one-node
//! Ceph cluster (radosgw).

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::*;

/// A moto S3 server (third-party S3 without RDMA) from the test virtualenv.
#[derive(Debug)]
pub struct Moto {
    child: Option<Child>,
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
}

impl Moto {
    /// Starts moto on a free port and waits until it accepts connections.
    pub fn start() -> Moto {
        let venv = workspace_root().join(".venv/bin/moto_server");
        assert!(
            venv.exists(),
            "{} is missing: run `bash .ci/setup.sh` (it installs moto from tests/requirements.txt)",
            venv.display()
        );
        let port = free_port();
        let mut child = Command::new(venv)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let endpoint = format!("http://127.0.0.1:{port}");
        // Generous: in the Soft-RoCE VM (emulated CPUs) importing moto alone
        // took over 30 s once. A moto that exits fails at once.
        let deadline = std::time::Instant::now() + Duration::from_secs(180);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("moto exited before it listened: {status}");
            }
            if std::time::Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("moto did not start in 180 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Moto {
            child: Some(child),
            endpoint,
        }
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A throw-away one-node Ceph cluster (one monitor, one memstore OSD,
/// radosgw on loopback, cephx off) from Debian's packages, started by
/// `tests/ceph/cluster.sh`: the existing S3 cluster the gateway and fallback
/// suites run against. One per test binary ([`Ceph::shared`]): it starts in
/// about 15 s, and the script's watcher stops it and deletes its directory
/// when the test process exits, however it exits.
#[derive(Debug)]
pub struct Ceph {
    dir: PathBuf,
    /// radosgw's S3 endpoint, `http://127.0.0.1:PORT`.
    pub endpoint: String,
    users: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl Ceph {
    /// The test binary's cluster, started on first use.
    ///
    /// # Panics
    /// When the Ceph packages are missing (`bash .ci/setup.sh` installs
    /// them) or the cluster does not come up (the message has the script's
    /// error, which names the daemon's log).
    pub fn shared() -> &'static Ceph {
        static CEPH: std::sync::OnceLock<Ceph> = std::sync::OnceLock::new();
        CEPH.get_or_init(Ceph::start)
    }

    fn start() -> Ceph {
        let dir = std::env::temp_dir().join(format!(
            "s3dma-ceph-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos()
        ));
        let (mon, rgw) = (free_port(), free_port());
        let out = Command::new("bash")
            .arg(workspace_root().join("tests/ceph/cluster.sh"))
            .args(["start", dir.to_str().unwrap()])
            .args([mon.to_string(), rgw.to_string()])
            .arg(std::process::id().to_string())
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "the Ceph cluster did not start: {}{}",
            stdout,
            String::from_utf8_lossy(&out.stderr)
        );
        let endpoint = stdout
            .lines()
            .find_map(|l| l.strip_prefix("endpoint "))
            .unwrap_or_else(|| panic!("cluster.sh printed no endpoint: {stdout}"))
            .to_string();
        Ceph {
            dir,
            endpoint,
            users: Default::default(),
        }
    }

    /// Makes `uid` an S3 user of the cluster with these keys (once per
    /// uid); returns an aws-sdk-s3 client for it.
    ///
    /// # Panics
    /// When `radosgw-admin` fails.
    pub fn user(&self, uid: &str, (ak, sk): (&str, &str)) -> S3Client {
        let mut users = self.users.lock().unwrap();
        if users.insert(uid.to_string()) {
            let out = Command::new("bash")
                .arg(workspace_root().join("tests/ceph/cluster.sh"))
                .args(["user", self.dir.to_str().unwrap(), uid, ak, sk])
                .stdin(Stdio::null())
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "radosgw-admin: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        s3_client(&self.endpoint, ak, sk)
    }

    /// `radosgw-admin` with this cluster's configuration; returns stdout.
    ///
    /// # Panics
    /// When it fails.
    pub fn admin(&self, args: &[&str]) -> String {
        let out = Command::new("radosgw-admin")
            .arg("-c")
            .arg(self.dir.join("ceph.conf"))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "radosgw-admin {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}
