//! The agent release (scripts/release-agent) as the Terraform modules' node boot script
//! (terraform/templates/node-boot.sh.tftpl) downloads and installs it.
//!
//! The script packages the debug `spotplane-agent` the tests built (`--binary`): a release
//! build of the agent takes too long for a test on two cores, and the packaging is the same.

use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use spotplane_tests::{Proc, bin, free_port, repo_root};

fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("{cmd:?} does not start: {e}"))
}

fn sha256_of(path: &Path) -> String {
    let out = run(Command::new("sha256sum").arg(path));
    assert!(out.status.success(), "sha256sum {}", path.display());
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .expect("sha256sum prints a digest")
        .to_owned()
}

/// The boot script's part that downloads, checks and installs the agent: the lines between
/// `%{ if agent_url != "" ~}` and `%{ endif ~}`, with the template's variables filled and the
/// install path moved under `root`, after the script's own `set` and `umask` lines.
fn install_steps(url: &str, sha256: &str, agent: &Path) -> String {
    let template =
        std::fs::read_to_string(repo_root().join("terraform/templates/node-boot.sh.tftpl"))
            .expect("terraform/templates/node-boot.sh.tftpl");
    let open = "%{ if agent_url != \"\" ~}\n";
    let start = template
        .find(open)
        .expect("the template has the agent_url block")
        + open.len();
    let end = start
        + template[start..]
            .find("%{ endif ~}")
            .expect("the agent_url block ends");
    let block = &template[start..end];
    assert!(
        template.contains("set -euo pipefail\numask 077\n"),
        "the template's shell options changed; update this test"
    );
    assert!(
        template.contains("AGENT=/usr/local/bin/spotplane-agent\n"),
        "the template installs the agent elsewhere now; update this test"
    );
    let filled = block
        .replace("${agent_url}", url)
        .replace("${agent_sha256}", sha256);
    assert!(
        !filled.contains("${"),
        "the install steps use a template variable this test does not fill:\n{filled}"
    );
    format!(
        "set -euo pipefail\numask 077\nAGENT='{}'\n{filled}",
        agent.display()
    )
}

/// A self-signed certificate for 127.0.0.1 (the boot script downloads over HTTPS only).
fn certificate(dir: &Path) -> (PathBuf, PathBuf) {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let out = run(Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args([
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert));
    assert!(
        out.status.success(),
        "openssl req: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (cert, key)
}

/// `python3 -m http.server`'s handler over TLS, serving `dir` on `port`.
fn https_server(dir: &Path, port: u16, cert: &Path, key: &Path, log: PathBuf) -> Proc {
    const SERVER: &str = r#"
import functools, http.server, ssl, sys
port, root, cert, key = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=root)
server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(cert, key)
server.socket = context.wrap_socket(server.socket, server_side=True)
server.serve_forever()
"#;
    let mut cmd = Command::new("python3");
    cmd.args(["-c", SERVER, &port.to_string()])
        .arg(dir)
        .arg(cert)
        .arg(key);
    let mut p = Proc::spawn(cmd, log);
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(status)) = p.child.try_wait() {
            panic!("the HTTPS server exited with {status}:\n{}", p.output());
        }
        assert!(
            Instant::now() < deadline,
            "the HTTPS server does not listen on {port}:\n{}",
            p.output()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    p
}

#[test]
fn the_boot_script_installs_the_released_agent_and_refuses_a_corrupted_one() {
    let agent = bin("spotplane-agent");
    let tmp = tempfile::tempdir().expect("tempdir");
    let dist = tmp.path().join("dist");
    let out = run(Command::new(repo_root().join("scripts/release-agent"))
        .arg("--binary")
        .arg(&agent)
        .arg("--out")
        .arg(&dist)
        .args(["--base-url", "https://downloads.example.com/spotplane"]));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "scripts/release-agent: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // One executable, its sha256sum line, the tarball and its line, and SHA256SUMS.
    let version = env!("CARGO_PKG_VERSION");
    let host = run(Command::new("rustc").arg("-vV"));
    let target = String::from_utf8_lossy(&host.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
        .expect("rustc -vV names the host");
    let name = format!("spotplane-agent-{version}-{target}");
    let released = dist.join(&name);
    let digest = sha256_of(&agent);
    assert_eq!(
        sha256_of(&released),
        digest,
        "the release is the binary given"
    );
    let line = std::fs::read_to_string(dist.join(format!("{name}.sha256"))).expect(".sha256");
    assert_eq!(line, format!("{digest}  {name}\n"));
    assert!(
        stdout.contains(&format!(
            "agent_url    = \"https://downloads.example.com/spotplane/{name}\""
        )) && stdout.contains(&format!("agent_sha256 = \"{digest}\"")),
        "prints the Terraform variables:\n{stdout}"
    );
    let check = run(Command::new("sha256sum")
        .args(["--quiet", "-c", "SHA256SUMS"])
        .current_dir(&dist));
    assert!(check.status.success(), "SHA256SUMS checks");
    let unpacked = tmp.path().join("unpacked");
    std::fs::create_dir(&unpacked).expect("mkdir");
    let untar = run(Command::new("tar")
        .arg("-xzf")
        .arg(dist.join(format!("{name}.tar.gz")))
        .arg("-C")
        .arg(&unpacked));
    assert!(untar.status.success(), "the tarball unpacks");
    assert_eq!(
        sha256_of(&unpacked.join(&name).join("spotplane-agent")),
        digest,
        "the tarball holds the same agent"
    );

    // A corrupted copy next to it: one byte changed.
    let mut bytes = std::fs::read(&released).expect("read the release");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(dist.join("corrupted"), &bytes).expect("write the corrupted copy");

    let (cert, key) = certificate(tmp.path());
    let port = free_port();
    let _server = https_server(&dist, port, &cert, &key, tmp.path().join("https.log"));

    let boot = |file: &str, root: &Path| {
        let installed = root.join("usr/local/bin/spotplane-agent");
        std::fs::create_dir_all(installed.parent().expect("parent")).expect("mkdir");
        let script = install_steps(
            &format!("https://127.0.0.1:{port}/{file}"),
            &digest,
            &installed,
        );
        let out = run(Command::new("bash")
            .args(["-c", &script])
            // curl trusts the test's certificate, and only it.
            .env("CURL_CA_BUNDLE", &cert)
            .env("TMPDIR", tmp.path()));
        (out, installed)
    };

    let (out, installed) = boot(&name, &tmp.path().join("root-good"));
    assert!(
        out.status.success(),
        "the install steps failed on the release:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(sha256_of(&installed), digest, "installed as downloaded");
    let mode = std::fs::metadata(&installed)
        .expect("installed")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o755, "installed executable");
    let version_out = run(Command::new(&installed).arg("--version"));
    assert!(
        version_out.status.success()
            && String::from_utf8_lossy(&version_out.stdout).contains(version),
        "the installed agent runs: {}",
        String::from_utf8_lossy(&version_out.stderr)
    );

    let (out, installed) = boot("corrupted", &tmp.path().join("root-bad"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "the install steps accepted a corrupted agent"
    );
    assert!(
        stderr.contains("did NOT match"),
        "sha256sum named the mismatch:\n{stderr}"
    );
    assert!(
        !installed.exists(),
        "nothing installed from a corrupted download"
    );
}
