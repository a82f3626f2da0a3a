//! A real browser: headless Chromium on the explorer's pages, trusting exactly the exchange's
//! certificate, and the checks a settled job's page must pass.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// Where browser screenshots go: `out/browser/` at the workspace root (look at them).
pub fn screenshots_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../out/browser");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The base64 SHA-256 of `cert`'s public key (what Chromium pins with
/// `--ignore-certificate-errors-spki-list`), or `None` when openssl cannot read it.
fn spki_sha256(cert: &Path) -> Option<String> {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "openssl x509 -in '{}' -pubkey -noout | openssl pkey -pubin -outform der \
             | openssl dgst -sha256 -binary | base64",
            cert.display()
        ))
        .output()
        .ok()?;
    let spki = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (out.status.success() && !spki.is_empty()).then_some(spki)
}

/// Headless Chromium (Debian's `chromium`, `scripts/setup.sh` installs it) on `url`, trusting
/// exactly the server certificate `cert` (its key pinned by SPKI hash), with `extra` flags.
fn chromium(url: &str, cert: &Path, extra: &[String]) -> std::io::Result<Output> {
    let spki = spki_sha256(cert).unwrap_or_default();
    let profile = super::scratch("chromium");
    Command::new("chromium")
        .args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            "--window-size=1280,2400",
        ])
        .arg(format!("--ignore-certificate-errors-spki-list={spki}"))
        .arg(format!("--user-data-dir={}", profile.path.display()))
        .args(extra)
        .arg(url)
        .stdin(Stdio::null())
        .output()
}

/// `url`'s DOM after it loaded in headless Chromium, and a screenshot of the page at `shot`.
pub fn browse(url: &str, cert: &Path, shot: &Path) -> String {
    let run = |extra: &[String]| {
        let out = chromium(url, cert, extra).expect("chromium runs (scripts/setup.sh installs it)");
        assert!(
            out.status.success(),
            "chromium {url}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    };
    run(&[format!("--screenshot={}", shot.display())]);
    assert!(shot.exists(), "no screenshot of {url}");
    String::from_utf8(run(&["--dump-dom".to_owned()]).stdout).unwrap()
}

/// `url`'s DOM in headless Chromium (as [`browse`], no screenshot), or `None` when the page
/// does not load (the server is not up yet).
pub fn try_browse(url: &str, cert: &Path) -> Option<String> {
    let out = chromium(url, cert, &["--dump-dom".to_owned()]).ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Checks a settled job's explorer page: the settled status, every cost term of the clearing
/// decision and the transaction hash on its tab's chain.
pub fn check_settled_job_page(dom: &str) {
    let status = element_text(dom, "status").expect("a status");
    assert!(status.contains("settled"), "{status}");
    let terms = element_text(dom, "cost-terms").expect("the cost terms");
    for term in [
        "compute",
        "latency",
        "failure",
        "verification",
        "deadline",
        "base",
        "adapter",
        "total",
    ] {
        assert!(terms.contains(term), "{term} missing: {terms}");
    }
    let tab = element_text(dom, "tab").expect("the tab");
    let chain = if tab.contains("31338") {
        "31338"
    } else {
        "31337"
    };
    let tx = element_text(dom, &format!("tx-{chain}")).expect("the transaction");
    assert!(tx.contains("0x") && tx.len() >= 66, "{tx}");
}

/// The text inside the element with `id` in `dom` (tags stripped), if there is one.
pub fn element_text(dom: &str, id: &str) -> Option<String> {
    let at = dom.find(&format!("id=\"{id}\""))?;
    let open = dom[..at].rfind('<')?;
    let tag: String = dom[open + 1..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric())
        .collect();
    let start = at + dom[at..].find('>')? + 1;
    let end = start + dom[start..].find(&format!("</{tag}>"))?;
    let mut text = String::new();
    let mut in_tag = false;
    for c in dom[start..end].chars() {
        match c {
            '<' => in_tag = true,
            '>' => in_tag = false,
            c if !in_tag => text.push(c),
            _ => {}
        }
    }
    Some(text.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// The `href` of the element with `id` in `dom`.
pub fn element_href(dom: &str, id: &str) -> Option<String> {
    let at = dom.find(&format!("id=\"{id}\""))?;
    let open = dom[..at].rfind('<')?;
    let close = at + dom[at..].find('>')?;
    let tag = &dom[open..close];
    let href = tag.find("href=\"")? + 6;
    Some(tag[href..href + tag[href..].find('"')?].replace("&amp;", "&"))
}
