//! A real OCI registry on loopback for the pull tests: Debian's
//! `docker-registry`, on 127.0.0.1:0 with its storage in a temporary
//! directory, fed with OCI layouts pushed by `skopeo`; and the layer every
//! pulled test image starts from.

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use cairn_image::testing::{LayerBlob, LayerTar};

/// A `docker-registry serve` on 127.0.0.1, killed on drop.
pub struct Registry {
    child: Child,
    tmp: tempfile::TempDir,
    pub port: u16,
}

impl Registry {
    pub fn start() -> Registry {
        Registry::start_with("")
    }

    /// With `extra` YAML appended to the config (an `auth:` section).
    pub fn start_with(extra: &str) -> Registry {
        let tmp = tempfile::Builder::new().prefix("cairn-registry-").tempdir_in("/var/tmp").expect("a directory for the registry's storage");
        let config = format!(
            "version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:0\n{extra}",
            tmp.path().join("data").display()
        );
        let path = tmp.path().join("config.yml");
        fs::write(&path, config).expect("write the registry's config");
        let mut child = Command::new("docker-registry")
            .arg("serve")
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("these tests need Debian's docker-registry package");
        let stderr = child.stderr.take().expect("the registry's stderr is piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if !sent {
                    if let Some(at) = line.find("listening on 127.0.0.1:") {
                        let port: String = line[at + "listening on 127.0.0.1:".len()..].chars().take_while(char::is_ascii_digit).collect();
                        let _ = tx.send(port.parse::<u16>().expect("the registry's port"));
                        sent = true;
                    }
                }
                // Keeps draining so the registry never blocks on its log.
            }
        });
        let port = rx.recv_timeout(Duration::from_secs(20)).expect("the registry did not say where it listens");
        Registry { child, tmp, port }
    }

    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Pushes `layout`'s image tagged `tag` as `repo:tag` (`--all` copies
    /// an index with every image in it).
    pub fn push(&self, layout: &Path, tag: &str, repo_tag: &str, creds: Option<&str>) {
        let mut c = Command::new("skopeo");
        c.args(["copy", "--insecure-policy", "--all", "--dest-tls-verify=false"]);
        if let Some(creds) = creds {
            c.args(["--dest-creds", creds]);
        }
        c.arg(format!("oci:{}:{tag}", layout.display())).arg(format!("docker://{}/{repo_tag}", self.host()));
        let out = super::output_within(c.stdin(Stdio::null()), Duration::from_secs(60));
        assert!(out.status.success(), "skopeo copy failed: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// The file holding blob `digest` in the registry's storage.
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.tmp.path().join("data/docker/registry/v2/blobs/sha256").join(&hex[..2]).join(hex).join("data")
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn busybox() -> Vec<u8> {
    let path = ["/usr/bin/busybox", "/bin/busybox"].into_iter().find(|p| Path::new(p).exists());
    fs::read(path.expect("these tests need a static busybox on the host (the image's shell)")).expect("read busybox")
}

pub fn base_layer() -> LayerBlob {
    let mut t = LayerTar::new().dir("bin").executable("bin/busybox", &busybox());
    for applet in ["sh", "cat", "ls", "echo", "test"] {
        t = t.symlink(&format!("bin/{applet}"), "busybox");
    }
    for d in ["proc", "dev", "tmp", "workspace", "etc"] {
        t = t.dir(d);
    }
    LayerBlob::gzip(&t.file("etc/a", b"base a\n").file("etc/b", b"base b\n").file("etc/c", b"base c\n").finish())
}

