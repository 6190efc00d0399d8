"""Drives Drover's web UI in headless Chromium (Debian's chromium and chromedriver,
through Selenium) against a dev agent, as a user would (host/drover/tests/cluster/ui.rs
runs it):

- /ui/ is public and carries the security headers; the API without a token is 403,
  and the UI says so until the token is typed into its token page;
- a job submitted through the API after the jobs page loaded appears on that page,
  without a reload;
- its allocation's page shows the task's stdout, and a line the task prints after
  the page opened arrives live; markup the task prints shows as text;
- the pages raise no CSP violation or script error;
- screenshots at 1280x800 and at a phone's size are saved to SHOTS_DIR.

Usage: ui_browser.py BASE_URL TOKEN SHOTS_DIR WORK_DIR
Each step prints one line; any failure raises with what was seen (and saves a
screenshot of it, failure-*.png)."""

import json
import os
import sys
import tempfile
import time
import urllib.error
import urllib.request

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

base, token, shots, work = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
os.makedirs(shots, exist_ok=True)
job_id = "ui-web"
marker = f"LIVE-LINE-{os.getpid()}"
trigger = os.path.join(work, "print-now")
# Task output is hostile: shown as text, never as markup.
hostile = "<img src=x onerror=window.__pwned=1><b>not bold</b>"


def step(text):
    print(text, flush=True)


def http(method, path, body=None, with_token=True):
    req = urllib.request.Request(base + path, method=method, data=None if body is None else json.dumps(body).encode())
    if with_token:
        req.add_header("X-Nomad-Token", token)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, dict(resp.headers), resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


# --- The page is public and strict; the API is not public.
status, headers, page = http("GET", "/ui/", with_token=False)
assert status == 200, (status, page)
h = {k.lower(): v for k, v in headers.items()}
csp = h.get("content-security-policy", "")
for part in ["default-src 'none'", "script-src 'self'", "frame-ancestors 'none'", "require-trusted-types-for 'script'"]:
    assert part in csp, csp
assert "unsafe-inline" not in csp and "unsafe-eval" not in csp, csp
assert h.get("x-content-type-options") == "nosniff", h
assert h.get("x-frame-options") == "DENY", h
assert h.get("referrer-policy") == "no-referrer", h
assert h.get("cache-control") == "no-cache" and h.get("etag"), h
assert "<script>" not in page, page
status, _, body = http("GET", "/v1/jobs", with_token=False)
assert status == 403, (status, body)
step("the page is public with its security headers; the API without a token is 403")

options = webdriver.ChromeOptions()
options.binary_location = os.environ.get("DROVER_TEST_CHROMIUM", "/usr/bin/chromium")
profile = tempfile.mkdtemp(prefix="chromium-profile-", dir=work)
for flag in [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    f"--user-data-dir={profile}",
    "--window-size=1280,800",
]:
    options.add_argument(flag)
options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
service = Service(executable_path=os.environ.get("DROVER_TEST_CHROMEDRIVER", "/usr/bin/chromedriver"))
driver = webdriver.Chrome(service=service, options=options)


def shot(name):
    path = os.path.join(shots, name)
    driver.save_screenshot(path)
    return path


def wait(what, check, limit=30):
    """`check()` until it is truthy (a stale element is not yet), or fail."""
    deadline = time.monotonic() + limit
    seen = None
    while time.monotonic() < deadline:
        try:
            seen = check()
        except StaleElementReferenceException:
            seen = None
        if seen:
            return seen
        time.sleep(0.1)
    try:
        shot(f"failure-{what.replace(' ', '-')[:40]}.png")
        body = driver.find_element(By.TAG_NAME, "body").text
    except Exception as e:  # noqa: BLE001 - what the page showed is only extra help
        body = f"(no page text: {e})"
    raise AssertionError(f"{what}: not within {limit}s; last seen {seen!r}; the page showed:\n{body[:3000]}")


def click(by, what):
    """Find and click, again if the page redrew the element in between (live pages
    rebuild their tables at every change)."""

    def attempt():
        driver.find_element(by, what).click()
        return True

    wait(f"a click on {what}", attempt)


def text_of(css):
    els = driver.find_elements(By.CSS_SELECTOR, css)
    return els[0].text if els else ""


def console_problems():
    bad = []
    for entry in driver.get_log("browser"):
        msg = entry.get("message", "")
        # A 403 before the token was set is expected (the UI shows it); anything the
        # CSP or Trusted Types refused, or a script error, is a bug.
        if "Content Security Policy" in msg or "TrustedHTML" in msg or "Trusted Type" in msg:
            bad.append(msg)
        elif entry.get("level") == "SEVERE" and "status of 403" not in msg and "/exec" not in msg:
            bad.append(msg)
    return bad


try:
    driver.set_window_size(1280, 800)
    # --- Without a token: the jobs page says what is missing.
    driver.get(base + "/")
    wait("the redirect to /ui/jobs", lambda: driver.current_url.endswith("/ui/jobs"))
    wait("the permission notice", lambda: "Permission denied" in text_of(".notice.error"))
    step("without a token the jobs page says permission denied")

    # --- The token, typed into the UI's token page.
    click(By.CSS_SELECTOR, "a.token-link")
    field = wait("the token field", lambda: driver.find_element(By.ID, "token-secret"))
    field.send_keys(token)
    click(By.ID, "token-save")
    wait("the token accepted", lambda: "accepted" in text_of(".notice.ok"))
    stored = driver.execute_script("return localStorage.getItem('drover.token')")
    assert stored == token, stored
    assert token not in driver.current_url
    step("token saved in the UI")

    click(By.LINK_TEXT, "Jobs")
    wait("the empty jobs list", lambda: "No jobs yet" in text_of("main"))
    # Anything kept in the page's window survives only if the page never reloads.
    driver.execute_script("window.__droverTestLoaded = 'still here'")
    step("jobs page loaded, no jobs")

    # --- A job submitted elsewhere (the API), after the page loaded.
    job = {
        "Job": {
            "ID": job_id,
            "Name": job_id,
            "Type": "service",
            "Datacenters": ["dc1"],
            "TaskGroups": [
                {
                    "Name": "web",
                    "Count": 1,
                    "Tasks": [
                        {
                            "Name": "server",
                            "Driver": "raw_exec",
                            "Config": {
                                "command": "/bin/sh",
                                "args": [
                                    "-c",
                                    f"echo task started; while [ ! -e {trigger} ]; do sleep 0.1; done; "
                                    f"echo {marker}; echo '{hostile}'; exec sleep 3600",
                                ],
                            },
                            "Resources": {"CPU": 100, "MemoryMB": 64},
                        }
                    ],
                }
            ],
        }
    }
    status, _, body = http("PUT", "/v1/jobs", job)
    assert status == 200, (status, body)
    row = f"tr[data-job='{job_id}']"
    wait("the job appearing on the loaded page", lambda: driver.find_elements(By.CSS_SELECTOR, row))
    wait("the job running on the page", lambda: "running" in text_of(row).lower() and "1 running" in text_of(row))
    assert driver.execute_script("return window.__droverTestLoaded") == "still here", "the page reloaded"
    step(f"job {job_id} appeared on the jobs page without a reload")
    shot("jobs-1280x800.png")

    # --- The job's page, then its allocation's.
    click(By.CSS_SELECTOR, f"{row} a")
    wait("the job page's allocation", lambda: driver.find_elements(By.CSS_SELECTOR, "tr[data-alloc]"))
    wait(
        "the allocation running on the job page",
        lambda: "running" in text_of("tr[data-alloc]").lower(),
    )
    wait("the job page's evaluations", lambda: "job-register" in text_of("main"))
    shot("job-1280x800.png")
    step("job page shows its groups, allocation and evaluation")

    click(By.CSS_SELECTOR, "tr[data-alloc] a")
    wait("the task's first line in the log view", lambda: "task started" in text_of("pre.log"))
    wait("the log stream live", lambda: text_of(".log-state") == "live")
    assert marker not in text_of("pre.log")
    step("allocation page streams the task's stdout")

    # The task prints its line only now, while the page is open.
    with open(trigger, "w") as f:
        f.write("go\n")
    wait("the line printed after the page opened", lambda: marker in text_of("pre.log"))
    wait("the hostile line shown as text", lambda: hostile in text_of("pre.log"))
    assert not driver.find_elements(By.CSS_SELECTOR, "pre.log *"), "task output became markup"
    assert driver.execute_script("return window.__pwned") is None, "task output ran a script"
    assert driver.execute_script("return window.__droverTestLoaded") == "still here", "the page reloaded"
    wait("the task's Started event", lambda: "Started" in text_of("main"))
    step(f"{marker} arrived live in the log view")
    shot("allocation-1280x800.png")
    alloc_url = driver.current_url

    click(By.LINK_TEXT, "Nodes")
    wait("the node ready with raw_exec", lambda: "ready" in text_of("tbody") and "raw_exec" in text_of("tbody"))
    shot("nodes-1280x800.png")
    click(By.CSS_SELECTOR, "tbody a")
    wait("the node's drivers and allocations", lambda: "raw_exec" in text_of("main") and job_id in text_of("main"))
    shot("node-1280x800.png")
    click(By.LINK_TEXT, "Services")
    wait("the services page", lambda: "Registered services" in text_of("main"))
    step("nodes, node and services pages shown")

    driver.get(alloc_url + "/exec?task=server")
    wait("the terminal page", lambda: driver.find_elements(By.CSS_SELECTOR, "pre.term"))
    # Connect: whatever the server answers (exec is tested elsewhere), the CSP must let
    # the page open its WebSocket to its own origin (checked in the console below).
    click(By.CSS_SELECTOR, ".term-bar button[type=submit]")
    wait(
        "the terminal's connection attempt to finish",
        lambda: text_of(".term-status") not in ("", "not connected", "connecting…") and text_of(".term-status"),
    )
    step(f"terminal page shown; connecting: {text_of('.term-status')}")
    # The exec works from the browser: the token rides in the first message, a line
    # typed runs in the task's shell, its output comes back (the terminal's echo of
    # the typed line says `$((6*7))`, never 42), and `exit 3` ends it with code 3.
    wait("the terminal connected", lambda: text_of(".term-status") == "connected")
    line = driver.find_element(By.CSS_SELECTOR, "input[aria-label='Line to send']")
    line.send_keys("echo exec-$((6*7))" + Keys.ENTER)
    wait("the command's output in the terminal", lambda: "exec-42" in text_of("pre.term"))
    shot("terminal-1280x800.png")
    line.send_keys("exit 3" + Keys.ENTER)
    wait("the exec's exit code", lambda: text_of(".term-status") == "exited with code 3")
    step("a command ran through the terminal and exited with code 3")

    # --- A phone: the device metrics of a 390x844 screen.
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": 390, "height": 844, "deviceScaleFactor": 2, "mobile": True},
    )
    driver.get(base + "/ui/jobs")
    wait("the job on the phone's jobs page", lambda: driver.find_elements(By.CSS_SELECTOR, row))
    overflow = driver.execute_script("return document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"the jobs page is {overflow}px wider than the phone"
    shot("jobs-phone-390x844.png")
    driver.get(alloc_url)
    wait("the log on the phone", lambda: marker in text_of("pre.log"))
    overflow = driver.execute_script("return document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"the allocation page is {overflow}px wider than the phone"
    shot("allocation-phone-390x844.png")
    step("phone-sized pages fit the screen")

    problems = console_problems()
    assert not problems, "the browser console reported:\n" + "\n".join(problems)
    step("no CSP violation or script error in the console")
finally:
    driver.quit()
step("screenshots in " + shots)
