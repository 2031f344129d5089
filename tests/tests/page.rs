//! The demo's live page in headless Chromium (Debian's `chromium`, which scripts/test
//! installs): `spotplane demo` runs its simulated world; the page, given the admin token in its
//! address, renders nodes by cloud and market, a slice diagram per GPU, jobs and events; a
//! screenshot shows the slice diagram's colours.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use spotplane_tests::live_demo;

fn chromium() -> Option<PathBuf> {
    for name in ["chromium", "chromium-browser", "google-chrome"] {
        if let Ok(out) = Command::new("which").arg(name).output()
            && out.status.success()
        {
            let p = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            if !p.is_empty() {
                return Some(PathBuf::from(p));
            }
        }
    }
    if std::env::var_os("SPOTPLANE_TEST_REQUIRE_EMULATORS").is_some() {
        panic!("chromium is not installed (scripts/test installs Debian's chromium)");
    }
    eprintln!("skipped: chromium is not installed");
    None
}

fn headless(browser: &Path, profile: &Path, args: &[&str]) -> std::process::Output {
    Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
            "--virtual-time-budget=6000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .output()
        .expect("chromium runs")
}

/// Pixels of the screenshot close to `rgb`.
fn count_colour(png_path: &Path, rgb: [u8; 3]) -> usize {
    let decoder = png::Decoder::new(std::io::BufReader::new(
        std::fs::File::open(png_path).expect("screenshot"),
    ));
    let mut reader = decoder.read_info().expect("a PNG");
    let mut buf = vec![0; reader.output_buffer_size().expect("size")];
    let info = reader.next_frame(&mut buf).expect("a frame");
    let channels = info.color_type.samples();
    buf[..info.buffer_size()]
        .chunks(channels)
        .filter(|p| {
            p.len() >= 3
                && p[..3]
                    .iter()
                    .zip(rgb)
                    .all(|(a, b)| (i16::from(*a) - i16::from(b)).abs() <= 6)
        })
        .count()
}

/// `GET /v1/overview` with the token.
async fn overview(http: &reqwest::Client, url: &str, token: &str) -> Value {
    http.get(format!("{url}/v1/overview"))
        .bearer_auth(token)
        .send()
        .await
        .expect("overview")
        .json()
        .await
        .expect("json")
}

/// The markup of the page's chart for `series`, from its root element (`class="chart"` and
/// `data-series`) to the next chart's.
fn chart<'a>(dom: &'a str, series: &str) -> Option<&'a str> {
    let at = dom.find(&format!("data-series=\"{series}\""))?;
    let open = dom[..at].rfind('<')?;
    let tag_end = at + dom[at..].find('>')?;
    if !dom[open..tag_end].contains("class=\"chart\"") {
        return None;
    }
    let rest = &dom[tag_end..];
    Some(&dom[open..tag_end + rest.find("data-series=\"").unwrap_or(rest.len())])
}

/// The number of points of each `class="series"` polyline in `markup`.
fn series_points(markup: &str) -> Vec<usize> {
    markup
        .split("<polyline")
        .skip(1)
        .filter_map(|rest| {
            let tag = &rest[..rest.find('>')?];
            if !tag.contains("class=\"series\"") {
                return None;
            }
            let points = tag.split("points=\"").nth(1)?;
            Some(points[..points.find('"')?].split_whitespace().count())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_page_draws_nodes_slices_and_jobs_in_headless_chromium() {
    let Some(browser) = chromium() else { return };
    let dir = tempfile::tempdir().expect("tmp");
    let (mut demo, url, token) = live_demo(dir.path()).await;
    // Wait for the world to have running jobs on nodes.
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let o = overview(&http, &url, &token).await;
        if o["replicas"].as_array().is_some_and(|r| r.len() >= 2) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no replicas placed in 120 s: {o}\n{}",
            demo.output()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // And for the charts over time to have a few samples (the demo takes one every 5 simulated
    // minutes).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let o = overview(&http, &url, &token).await;
        if o["history"].as_array().is_some_and(|h| h.len() >= 3) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the overview's history has fewer than 3 samples after 60 s: {}\n{}",
            o["history"],
            demo.output()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Without a token the page asks for one and shows nothing.
    let page = format!("{url}/");
    let out = headless(
        &browser,
        &dir.path().join("profile-a"),
        &["--dump-dom", &page],
    );
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(dom.contains("Paste an admin or finance token"), "{dom}");
    assert!(
        !dom.contains("data-rendered=\"true\""),
        "nothing rendered without a token"
    );

    // With it: the whole picture.
    let page = format!("{url}/#token={token}");
    let out = headless(
        &browser,
        &dir.path().join("profile-b"),
        &["--dump-dom", &page],
    );
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(
        dom.contains("data-rendered=\"true\""),
        "rendered: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        &dom[..dom.len().min(3000)]
    );
    assert!(
        dom.matches("class=\"gpu\"").count() >= 2,
        "a slice diagram per GPU"
    );
    assert!(dom.contains("class=\"node spot"), "nodes by market");
    assert!(
        dom.contains("class=\"whole\"")
            || dom.contains("mig-slice")
            || dom.contains("class=\"share\"")
    );
    assert!(dom.contains("state-running"), "running jobs listed");
    // Four charts over time; the spend chart draws spend and its on-demand equivalent as lines.
    for series in ["spend", "queue", "allocation", "utilisation"] {
        assert!(
            chart(&dom, series).is_some(),
            "a chart with class=\"chart\" and data-series=\"{series}\": {}",
            &dom[..dom.len().min(3000)]
        );
    }
    let spend = chart(&dom, "spend").expect("the spend chart");
    assert!(
        series_points(spend).iter().filter(|&&n| n >= 2).count() >= 2,
        "spend and on-demand lines of 2 points or more: {spend}"
    );
    // The jobs table has an SM utilisation column, a cell in every row.
    assert!(dom.contains("<th>SM util</th>"), "an SM util column");
    let jobs = dom
        .split("<tbody id=\"jobs\">")
        .nth(1)
        .and_then(|rest| rest.split("</tbody>").next())
        .unwrap_or_default();
    let rows = jobs.matches("<tr").count();
    assert!(
        rows >= 1 && jobs.matches("<td class=\"util\"").count() == rows,
        "an SM util cell per job: {jobs}"
    );

    let shot = dir.path().join("page.png");
    let out = headless(
        &browser,
        &dir.path().join("profile-c"),
        &[
            &format!("--screenshot={}", shot.display()),
            "--window-size=1400,1000",
            &page,
        ],
    );
    assert!(
        shot.exists(),
        "screenshot written: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The slice diagram's colours — whole GPUs (#39c5cf), MIG instances in use (#58a6ff),
    // shares (#bc8cff) — are on screen, in bars.
    let whole = count_colour(&shot, [0x39, 0xc5, 0xcf]);
    let mig = count_colour(&shot, [0x58, 0xa6, 0xff]);
    let share = count_colour(&shot, [0xbc, 0x8c, 0xff]);
    assert!(
        whole + mig + share >= 200,
        "slice diagram pixels: whole {whole}, MIG {mig}, shares {share}"
    );
    // The spend line (#f0883e) across the spend chart: some hundreds of pixels; its legend key
    // alone is about 26.
    let spend = count_colour(&shot, [0xf0, 0x88, 0x3e]);
    assert!(spend >= 100, "spend line pixels: {spend}");
    if let Some(keep) = std::env::var_os("SPOTPLANE_KEEP_SCREENSHOT") {
        let _ = std::fs::copy(&shot, keep);
    }
    assert!(
        demo.terminate(),
        "the demo exits on SIGTERM:\n{}",
        demo.output()
    );
}
