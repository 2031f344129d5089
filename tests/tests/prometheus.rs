//! spotplane under a real Prometheus (Debian's `prometheus`, which ships `promtool`; scripts/test
//! installs it). `spotplane demo` runs its simulated world at an hour a second; Prometheus
//! scrapes its `/metrics` every second with the admin token, as docs/observability.md tells
//! operators to; then:
//!
//! - every expression of the Grafana dashboard (`deploy/grafana/spotplane.json`), with its
//!   variables set to "All" (`.*`) and Grafana's intervals to `1m`, returns data, as do the
//!   label-value queries behind its variables;
//! - the expressions of NVIDIA's published dcgm-exporter dashboard (`grafana/
//!   dcgm-exporter-dashboard.json` in NVIDIA/dcgm-exporter: GPU temperature, power, SM clock,
//!   utilisation, framebuffer, tensor pipe, filtered by `instance` and `gpu`) return data on
//!   spotplane's DCGM series, which carry the job and the team of the job holding the device;
//! - `promtool check metrics` finds nothing to say about the scrape.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use spotplane_tests::{Proc, free_port, live_demo, repo_root, tail};

/// How long the expressions get to return data once Prometheus scrapes: the recovery families
/// (notices, checkpoints, lost work) only get series once the demo's world has preempted spot
/// nodes, which at 3600× takes a simulated hour or two, seconds here; the rest is margin for
/// two busy cores.
const DATA_WITHIN: Duration = Duration::from_secs(240);

/// What Grafana's built-in intervals become in the test: Prometheus scrapes every second, so a
/// minute holds enough samples for `rate`.
const INTERVAL: &str = "1m";

/// `prometheus` and `promtool` from PATH. Without them the test says so and passes, unless
/// `SPOTPLANE_TEST_REQUIRE_EMULATORS` is set (scripts/test installs them): then it fails.
fn prometheus_tools() -> Option<(PathBuf, PathBuf)> {
    let which = |name: &str| {
        Command::new("which")
            .arg(name)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
            .filter(|p| !p.as_os_str().is_empty())
    };
    match (which("prometheus"), which("promtool")) {
        (Some(server), Some(tool)) => Some((server, tool)),
        _ => {
            assert!(
                std::env::var_os("SPOTPLANE_TEST_REQUIRE_EMULATORS").is_none(),
                "prometheus or promtool is not on PATH and SPOTPLANE_TEST_REQUIRE_EMULATORS is set: \
                 install Debian's prometheus (scripts/test does)"
            );
            eprintln!("skipped: prometheus and promtool are not installed");
            None
        }
    }
}

/// Every `targets[].expr` of the dashboard's panels, rows' nested panels included, with the
/// title of its panel.
fn dashboard_exprs(dashboard: &Value) -> Vec<(String, String)> {
    fn walk(panels: &Value, out: &mut Vec<(String, String)>) {
        for p in panels.as_array().into_iter().flatten() {
            let title = p["title"].as_str().unwrap_or("(untitled)");
            for t in p["targets"].as_array().into_iter().flatten() {
                if let Some(e) = t["expr"].as_str() {
                    out.push((title.to_owned(), e.to_owned()));
                }
            }
            walk(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

/// `expr` as Grafana sends it with every variable of `vars` at "All" (`.*`) and its built-in
/// intervals at [`INTERVAL`]: `$v`, `${v}` and `${v:format}` are all replaced.
fn substitute(expr: &str, vars: &[String]) -> String {
    let mut out = String::new();
    let mut rest = expr;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (name, used) = if let Some(braced) = after.strip_prefix('{') {
            let close = braced
                .find('}')
                .unwrap_or_else(|| panic!("unclosed ${{ in {expr}"));
            let inner = &braced[..close];
            (inner.split(':').next().unwrap_or(inner), close + 2)
        } else {
            let len = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..len], len)
        };
        let value = match name {
            "__rate_interval" | "__interval" | "__range" => INTERVAL,
            v if vars.iter().any(|n| n == v) => ".*",
            other => panic!(
                "`{expr}` uses ${other}, which is neither a variable of the dashboard nor one the test knows"
            ),
        };
        out.push_str(value);
        rest = &after[used..];
    }
    out.push_str(rest);
    out
}

/// `label_values(<selector>, <label>)`, a variable's query, as (selector, label).
fn label_values_query(q: &str) -> Option<(String, String)> {
    let inner = q.trim().strip_prefix("label_values(")?.strip_suffix(')')?;
    let (selector, label) = inner.rsplit_once(',')?;
    Some((selector.trim().to_owned(), label.trim().to_owned()))
}

/// The text format Prometheus's own exposition uses (0.0.4: what `promtool check metrics`
/// parses) from the OpenMetrics 1.0 text spotplane answers with. The two differ in how they
/// name a counter's family (`foo` with samples `foo_total` in OpenMetrics, `foo_total` in the
/// text format, where a `foo_total` sample under `# TYPE foo` is an untyped family of its own,
/// "no help text"), in OpenMetrics' `# UNIT` and `# EOF` lines, `_created` samples, exemplars
/// and info families, and in what HELP text may escape. Everything else passes through
/// unchanged, so promtool lints spotplane's names, types and help as Prometheus stores them.
fn openmetrics_to_text(om: &str) -> String {
    // Family name → (kind, the name of its family in the text format).
    let mut families: HashMap<&str, (&str, String)> = HashMap::new();
    for line in om.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut it = rest.split_whitespace();
        if let (Some(name), Some(kind)) = (it.next(), it.next()) {
            let text_name = match kind {
                "counter" => format!("{name}_total"),
                "info" => format!("{name}_info"),
                _ => name.to_owned(),
            };
            families.insert(name, (kind, text_name));
        }
    }
    let renamed = |name: &str| families.get(name).map_or(name.to_owned(), |f| f.1.clone());
    let mut out = String::new();
    for line in om.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") || line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            // OpenMetrics escapes `"` in HELP; the text format knows only `\\` and `\n`.
            let mut text = String::new();
            let mut chars = help.chars();
            while let Some(c) = chars.next() {
                if c != '\\' {
                    text.push(c);
                    continue;
                }
                match chars.next() {
                    Some('"') => text.push('"'),
                    Some(e) => {
                        text.push('\\');
                        text.push(e);
                    }
                    None => text.push('\\'),
                }
            }
            out.push_str(&format!("# HELP {} {text}\n", renamed(name)));
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split_whitespace();
            let (name, kind) = (it.next().unwrap_or(""), it.next().unwrap_or(""));
            let kind = match kind {
                "info" | "stateset" => "gauge",
                "gaugehistogram" => "histogram",
                "unknown" => "untyped",
                k => k,
            };
            out.push_str(&format!("# TYPE {} {kind}\n", renamed(name)));
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        // A sample: without its exemplar, and without the `_created` series OpenMetrics adds to
        // counters and histograms (the text format has none).
        let sample = line.split(" # ").next().unwrap_or(line);
        let name = sample.split(['{', ' ']).next().unwrap_or("");
        if let Some(base) = name.strip_suffix("_created")
            && families.get(base).is_some_and(|f| {
                matches!(f.0, "counter" | "histogram" | "summary" | "gaugehistogram")
            })
        {
            continue;
        }
        out.push_str(sample);
        out.push('\n');
    }
    out
}

/// The lines of a text-format exposition whose family name starts with `prefix`, and the rest.
fn split_families(text: &str, prefix: &str) -> (String, String) {
    let (mut with, mut without) = (String::new(), String::new());
    for line in text.lines() {
        let name = match line.strip_prefix("# ") {
            Some(c) => c.split_whitespace().nth(1).unwrap_or(""),
            None => line.split(['{', ' ']).next().unwrap_or(""),
        };
        let to = if name.starts_with(prefix) {
            &mut with
        } else {
            &mut without
        };
        to.push_str(line);
        to.push('\n');
    }
    (with, without)
}

/// `promtool check metrics` of `text` on stdin: its exit code and everything it printed
/// (problems go to stderr in 2.42 and to stdout in later releases).
fn promtool_check(promtool: &Path, text: &str) -> (Option<i32>, String) {
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool runs");
    child
        .stdin
        .take()
        .expect("promtool's stdin")
        .write_all(text.as_bytes())
        .expect("metrics written to promtool");
    let out = child.wait_with_output().expect("promtool exits");
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), printed.trim().to_owned())
}

/// A Prometheus HTTP API client.
struct Prom {
    http: reqwest::Client,
    base: String,
}

impl Prom {
    async fn get(&self, path: &str, params: &[(&str, &str)]) -> Value {
        let mut url = reqwest::Url::parse(&format!("{}{path}", self.base)).expect("url");
        for (k, v) in params {
            url.query_pairs_mut().append_pair(k, v);
        }
        let resp = self
            .http
            .get(url)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{path} {params:?}: {e}"));
        let status = resp.status();
        let body: Value = resp
            .json()
            .await
            .unwrap_or_else(|e| panic!("{path} {params:?}: not JSON: {e}"));
        assert!(
            status.is_success() && body["status"] == "success",
            "{path} {params:?}: {status} {body}"
        );
        body["data"].clone()
    }

    /// An instant query's result vector (a scalar answer comes back as one sample).
    async fn query(&self, expr: &str) -> Vec<Value> {
        let data = self.get("/api/v1/query", &[("query", expr)]).await;
        match data["resultType"].as_str() {
            Some("vector") => data["result"].as_array().cloned().unwrap_or_default(),
            Some("scalar") => vec![json!({"metric": {}, "value": data["result"]})],
            other => panic!("`{expr}` answered a {other:?}, not a vector: {data}"),
        }
    }

    async fn label_values(&self, label: &str, selector: &str) -> Vec<String> {
        let data = self
            .get(
                &format!("/api/v1/label/{label}/values"),
                &[("match[]", selector)],
            )
            .await;
        data.as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect()
    }
}

/// Whether a result has a sample whose value is a number (histogram quantiles of a window
/// without observations are NaN, which a panel draws as nothing).
fn has_number(result: &[Value]) -> bool {
    result.iter().any(|s| {
        s["value"][1]
            .as_str()
            .and_then(|v| v.parse::<f64>().ok())
            .is_some_and(f64::is_finite)
    })
}

fn short(v: &[Value]) -> String {
    let s = Value::Array(v.to_vec()).to_string();
    s.chars().take(300).collect()
}

#[test]
fn openmetrics_counters_become_text_format_families_for_promtool() {
    let om = "# HELP spotplane_notices Termination notices \\\"heard\\\".\n\
              # TYPE spotplane_notices counter\n\
              spotplane_notices_total{cloud=\"aws\",kind=\"spot\"} 3 # {trace_id=\"a\"} 1.0\n\
              spotplane_notices_created{cloud=\"aws\",kind=\"spot\"} 1700000000.0\n\
              # HELP spotplane_checkpoint_seconds Checkpoint duration.\n\
              # TYPE spotplane_checkpoint_seconds histogram\n\
              # UNIT spotplane_checkpoint_seconds seconds\n\
              spotplane_checkpoint_seconds_sum 1.5\n\
              spotplane_checkpoint_seconds_count 2\n\
              spotplane_checkpoint_seconds_bucket{le=\"+Inf\"} 2\n\
              # EOF\n";
    assert_eq!(
        openmetrics_to_text(om),
        "# HELP spotplane_notices_total Termination notices \"heard\".\n\
         # TYPE spotplane_notices_total counter\n\
         spotplane_notices_total{cloud=\"aws\",kind=\"spot\"} 3\n\
         # HELP spotplane_checkpoint_seconds Checkpoint duration.\n\
         # TYPE spotplane_checkpoint_seconds histogram\n\
         spotplane_checkpoint_seconds_sum 1.5\n\
         spotplane_checkpoint_seconds_count 2\n\
         spotplane_checkpoint_seconds_bucket{le=\"+Inf\"} 2\n"
    );
    let (dcgm, rest) = split_families(
        "# HELP DCGM_FI_DEV_GPU_UTIL u\nDCGM_FI_DEV_GPU_UTIL{gpu=\"0\"} 1\n# HELP x y\nx 1\n",
        "DCGM_",
    );
    assert_eq!(dcgm.lines().count(), 2);
    assert_eq!(rest, "# HELP x y\nx 1\n");
}

#[test]
fn dashboard_variables_and_intervals_are_substituted_as_grafana_would_with_all_selected() {
    let vars = vec!["team".to_owned(), "cloud".to_owned()];
    assert_eq!(
        substitute(
            "sum by (team) (rate(x{team=~\"$team\", cloud=~\"${cloud:regex}\"}[$__rate_interval])) / $__range",
            &vars
        ),
        "sum by (team) (rate(x{team=~\".*\", cloud=~\".*\"}[1m])) / 1m"
    );
    assert_eq!(
        label_values_query("label_values({__name__=~\"a|b\", team!=\"\"}, team)"),
        Some((
            "{__name__=~\"a|b\", team!=\"\"}".to_owned(),
            "team".to_owned()
        ))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_the_demo_and_every_dashboard_expression_returns_data() {
    let Some((prometheus, promtool)) = prometheus_tools() else {
        return;
    };
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(repo_root().join("deploy/grafana/spotplane.json"))
            .expect("deploy/grafana/spotplane.json"),
    )
    .expect("the dashboard is JSON");

    // 1. The demo, as a user starts it.
    let dir = tempfile::tempdir().expect("tmp");
    let (mut demo, url, token) = live_demo(dir.path()).await;
    let target = url.trim_start_matches("http://").to_owned();
    let token_file = dir.path().join("data/demo/admin-token");
    let http = reqwest::Client::new();

    // The demo answers before its world has made its teams.
    let made = Instant::now() + Duration::from_secs(60);
    while http
        .get(format!("{url}/v1/teams/vision"))
        .bearer_auth(&token)
        .send()
        .await
        .map_or(true, |r| r.status() != 200)
    {
        assert!(
            Instant::now() < made,
            "the demo made no team vision in 60 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // 2. What the demo's world does not set up itself. Its teams have neither quotas nor
    //    budgets, and the team panels show only teams with them; its queue empties within
    //    moments (the world buys what the trace's jobs ask for). So: a team with quotas in a
    //    cohort it may not borrow from, with a gang bigger than its H100 quota, which waits
    //    for good (reason `quota`); and a budget for one of the demo's teams, whose jobs spend
    //    against it.
    let r = http
        .post(format!("{url}/v1/teams"))
        .bearer_auth(&token)
        .json(&json!({
            "name": "observed",
            "cohort": "observed",
            "quotas": {
                "H100-80GB": {"nominal": 2, "borrowing_limit": 0},
                "mig-1g.10gb": {"nominal": 4},
            },
        }))
        .send()
        .await
        .expect("create a team");
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap_or_default());
    let r = http
        .post(format!("{url}/v1/jobs"))
        .bearer_auth(&token)
        .json(&json!({
            "name": "over-quota",
            "team": "observed",
            "replicas": 3,
            "shape": {"gpus": 1, "models": ["H100-80GB"]},
            "command": ["sleep", "1"],
        }))
        .send()
        .await
        .expect("submit a job");
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap_or_default());
    let r = http
        .put(format!("{url}/v1/teams/vision/budget"))
        .bearer_auth(&token)
        .json(&json!({"monthly_usd": 1_000_000.0}))
        .send()
        .await
        .expect("set a budget");
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());

    // 3. Prometheus, scraping the demo every second with the token from a file, as
    //    docs/observability.md configures it.
    let prom_port = free_port();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n\
             scrape_configs:\n  - job_name: spotplane\n    authorization:\n      credentials_file: {}\n    \
             static_configs:\n      - targets: [\"{target}\"]\n",
            token_file.display()
        ),
    )
    .expect("prometheus.yml");
    let check = Command::new(&promtool)
        .args(["check", "config"])
        .arg(&config)
        .output()
        .expect("promtool runs");
    assert!(
        check.status.success(),
        "promtool check config: {}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    let mut cmd = Command::new(&prometheus);
    cmd.arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("tsdb").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"));
    let mut server = Proc::spawn(cmd, dir.path().join("prometheus.log"));
    let prom_url = format!("http://127.0.0.1:{prom_port}");
    server.wait_healthy(&format!("{prom_url}/-/ready")).await;
    let prom = Prom {
        http: http.clone(),
        base: prom_url,
    };

    // 4. The expressions that must return data: (what, expression).
    let mut wanted: Vec<(String, String)> = [
        ("nodes by cloud", "sum by (cloud) (spotplane_nodes)"),
        ("queue by team", "sum by (team) (spotplane_queued_jobs)"),
        ("spend", "sum(spotplane_spend_rate_usd_per_hour) > 0"),
        (
            "a device held by a job",
            "DCGM_FI_DEV_GPU_UTIL{job_id!=\"\"}",
        ),
        (
            "a MIG instance",
            "{__name__=~\"DCGM_.+\", GPU_I_PROFILE!=\"\", GPU_I_ID!=\"\"}",
        ),
    ]
    .into_iter()
    .map(|(w, e)| (w.to_owned(), e.to_owned()))
    .collect();
    // Every panel of the dashboard, its variables at "All". Each must return data: where a
    // family has no series until something happens, the dashboard waits for it to happen (the
    // recovery histograms) or, for a counter whose absence means zero and only then, adds
    // `or vector(0)` (provider errors: none yet is none; the provider call latencies beside
    // them show the clouds are called at all).
    let variables = dashboard["templating"]["list"]
        .as_array()
        .expect("templating.list");
    let names: Vec<String> = variables
        .iter()
        .filter_map(|v| v["name"].as_str().map(str::to_owned))
        .collect();
    let exprs = dashboard_exprs(&dashboard);
    assert!(exprs.len() >= 30, "the dashboard's panels: {exprs:?}");
    for (title, e) in &exprs {
        wanted.push((format!("dashboard: {title}"), substitute(e, &names)));
    }
    // NVIDIA's dcgm-exporter dashboard, its `instance` and `gpu` variables at "All".
    let all = "{instance=~\".*\", gpu=~\".*\"}";
    for e in [
        "DCGM_FI_DEV_GPU_TEMP{}",
        "avg(DCGM_FI_DEV_GPU_TEMP{})",
        "DCGM_FI_DEV_POWER_USAGE{}",
        "sum(DCGM_FI_DEV_POWER_USAGE{})",
        "DCGM_FI_DEV_SM_CLOCK{} * 1000000",
        "DCGM_FI_DEV_GPU_UTIL{}",
        "DCGM_FI_DEV_FB_USED{}",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{}",
    ] {
        wanted.push(("dcgm-exporter dashboard".into(), e.replace("{}", all)));
    }
    // The variables' queries: (what, label, selector).
    let mut label_queries: Vec<(String, String, String)> = vec![
        (
            "dcgm-exporter dashboard's instance".into(),
            "instance".into(),
            "DCGM_FI_DEV_GPU_TEMP".into(),
        ),
        (
            "dcgm-exporter dashboard's gpu".into(),
            "gpu".into(),
            "DCGM_FI_DEV_GPU_TEMP".into(),
        ),
    ];
    for v in variables.iter().filter(|v| v["type"] == "query") {
        let q = v["query"]["query"]
            .as_str()
            .or(v["query"].as_str())
            .unwrap_or_default();
        let (selector, label) = label_values_query(q)
            .unwrap_or_else(|| panic!("variable {}: not label_values(...): {q}", v["name"]));
        label_queries.push((format!("dashboard variable {}", v["name"]), label, selector));
    }

    // 5. Poll until each has returned a number at least once (the queue empties now and then;
    //    the recovery histograms have observations only while preemptions happen).
    let mut last: BTreeMap<usize, Vec<Value>> = BTreeMap::new();
    let mut pending: BTreeSet<usize> = (0..wanted.len()).collect();
    let mut labels_pending: BTreeSet<usize> = (0..label_queries.len()).collect();
    let deadline = Instant::now() + DATA_WITHIN;
    while !(pending.is_empty() && labels_pending.is_empty()) && Instant::now() < deadline {
        if let Ok(Some(status)) = demo.child.try_wait() {
            panic!("the demo exited with {status}:\n{}", demo.output());
        }
        for i in pending.clone() {
            let result = prom.query(&wanted[i].1).await;
            if has_number(&result) {
                pending.remove(&i);
            }
            last.insert(i, result);
        }
        for i in labels_pending.clone() {
            let (_, label, selector) = &label_queries[i];
            if !prom.label_values(label, selector).await.is_empty() {
                labels_pending.remove(&i);
            }
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    if !(pending.is_empty() && labels_pending.is_empty()) {
        let scrape = http
            .get(format!("{url}/metrics"))
            .bearer_auth(&token)
            .send()
            .await
            .expect("scrape");
        let scrape = scrape.text().await.unwrap_or_default();
        let families: BTreeSet<&str> = scrape
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        let missing: Vec<String> = pending
            .iter()
            .map(|&i| {
                format!(
                    "  {}: {}\n    last answer: {}",
                    wanted[i].0,
                    wanted[i].1,
                    short(last.get(&i).map_or(&[][..], Vec::as_slice))
                )
            })
            .chain(labels_pending.iter().map(|&i| {
                let (what, label, selector) = &label_queries[i];
                format!("  {what}: label_values({selector}, {label}) is empty")
            }))
            .collect();
        panic!(
            "{} of {} expressions returned no data within {} s:\n{}\n\nthe families /metrics has now: {families:?}\n\nthe demo's log:\n{}\n\nPrometheus's log:\n{}",
            missing.len(),
            wanted.len() + label_queries.len(),
            DATA_WITHIN.as_secs(),
            missing.join("\n"),
            tail(&demo.output(), 40),
            tail(&server.output(), 20),
        );
    }

    // 6. The DCGM series name the job and the team holding the device, under labels of their
    //    own: `job` is Prometheus's (the scrape job), so none is `exported_job`.
    let held = prom.query("DCGM_FI_DEV_GPU_UTIL{job_id!=\"\"}").await;
    for s in &held {
        let m = &s["metric"];
        for label in ["job_name", "team", "gpu", "UUID", "modelName", "device"] {
            assert!(
                m[label].as_str().is_some_and(|v| !v.is_empty()),
                "{label} on {m}"
            );
        }
        assert_eq!(m["job"], "spotplane", "the scrape job's label: {m}");
        assert!(m.get("exported_job").is_none(), "{m}");
    }
    // NVIDIA's dashboard with one instance and one GPU picked, as a user narrows it.
    let instance = prom
        .label_values("instance", "DCGM_FI_DEV_GPU_TEMP")
        .await
        .into_iter()
        .next()
        .expect("an instance");
    let gpu = prom
        .label_values("gpu", "DCGM_FI_DEV_GPU_TEMP")
        .await
        .into_iter()
        .next()
        .expect("a gpu");
    let picked = format!("DCGM_FI_DEV_GPU_TEMP{{instance=~\"{instance}\", gpu=~\"{gpu}\"}}");
    assert!(!prom.query(&picked).await.is_empty(), "{picked}");

    // 7. Prometheus parsed every scrape (a scrape it cannot parse is `up` 0, with the parser's
    //    error as the target's last error). A few late scrapes a minute are allowed for two busy
    //    cores.
    let up = prom.query("avg_over_time(up{job=\"spotplane\"}[1m])").await;
    let up_ratio = up
        .first()
        .and_then(|s| s["value"][1].as_str())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0);
    if up_ratio < 0.95 {
        let targets = prom.get("/api/v1/targets", &[]).await;
        panic!("the demo was up for {up_ratio} of the last minute's scrapes: {targets}");
    }

    // 8. promtool has nothing to say about the scrape: spotplane's families
    //    pass clean. dcgm-exporter's label names (`modelName`, `UUID`, `GPU_I_PROFILE`) are
    //    kept as NVIDIA spells them, for its dashboards and users' queries, and promtool
    //    flags camelCase label names: on the DCGM families, that and only that is accepted.
    let resp = http
        .get(format!("{url}/metrics"))
        .bearer_auth(&token)
        .send()
        .await
        .expect("scrape");
    assert_eq!(resp.status(), 200);
    let text = openmetrics_to_text(&resp.text().await.expect("the scrape's body"));
    let (dcgm, own) = split_families(&text, "DCGM_");
    assert!(
        own.contains("spotplane_nodes") && dcgm.contains("DCGM_FI_DEV_GPU_UTIL"),
        "an admin scrape has the fleet and the DCGM families"
    );
    let (code, printed) = promtool_check(&promtool, &own);
    assert!(
        code == Some(0) && printed.is_empty(),
        "promtool check metrics on spotplane's families: exit {code:?}\n{printed}"
    );
    let (code, printed) = promtool_check(&promtool, &dcgm);
    // Exit 3: lint problems only (1 is a parse error).
    assert!(
        matches!(code, Some(0 | 3))
            && printed.lines().all(|l| {
                l.starts_with("DCGM_")
                    && l.ends_with(" label names should be written in 'snake_case' not 'camelCase'")
            }),
        "promtool check metrics on the DCGM families: exit {code:?}\n{}",
        printed
            .lines()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect::<Vec<_>>()
            .join("\n")
    );

    drop(server);
    assert!(
        demo.terminate(),
        "the demo exits on SIGTERM:\n{}",
        demo.output()
    );
}
