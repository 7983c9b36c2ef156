#!/usr/bin/env python3
"""The admin dashboard in a real headless browser (Debian's chromium through chromedriver).

Usage: browser_test.py TOLLGATE_BINARY [SCREENSHOT_DIR]

Starts `tollgate serve` with an admin token on free loopback ports, sends a workload whose
answer is known, and drives the page at the admin listener's `/`: the token form, no console
error, the traffic shown, a shadow rule's per-tenant would-deny share, and a rollback from the
page that changes the running version. Writes a desktop and a phone-sized screenshot of each
view into SCREENSHOT_DIR (default: target/dashboard under the repository).
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

TOKEN = "dashboard-test-token"

# A shadow rule keyed on tenant then user with per-value counts, and an enforced one per user.
POLICY = """domain: api
descriptors:
  - key: tenant
    descriptors:
      - key: user
        detailed_metric: true
        rate_limit:
          name: per_tenant_user
          unit: day
          requests_per_unit: 2
          mode: shadow
  - key: user
    detailed_metric: true
    rate_limit:
      name: per_user
      unit: day
      requests_per_unit: LIMIT
"""

VIEWS = ["now", "throttled", "changes", "health"]
DESKTOP = (1366, 900)
PHONE = (390, 844)


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


class Tollgate:
    """`tollgate serve` on kernel-chosen loopback ports."""

    def __init__(self, binary, workdir):
        policy = Path(workdir, "policy.yaml")
        policy.write_text(POLICY.replace("LIMIT", "3"))
        token = Path(workdir, "token")
        token.write_text(TOKEN + "\n")
        env = dict(os.environ, RUST_LOG="warn")
        env.pop("TOLLGATE_ADMIN_TOKEN", None)
        self.process = subprocess.Popen(
            [binary, "serve", "--config", str(policy), "--http-addr", "127.0.0.1:0",
             "--grpc-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0",
             "--admin-token-file", str(token)],
            stdout=subprocess.PIPE, env=env, text=True)
        addrs = {}
        deadline = time.monotonic() + 30
        while len(addrs) < 3 and time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                fail("tollgate serve exited before listening")
            m = re.match(r"(\w+) listening on (\S+)", line)
            if m:
                addrs[m.group(1)] = m.group(2)
        self.http, self.admin = addrs["http"], addrs["admin"]
        threading.Thread(target=self.process.stdout.read, daemon=True).start()

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=20)

    def call(self, base, method, path, body=None, token=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"http://{base}{path}", data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.loads(answer.read() or b"null")

    def check(self, entries_list):
        body = {"domain": "api", "descriptors": [
            {"entries": [{"key": k, "value": v} for k, v in entries]} for entries in entries_list]}
        try:
            return self.call(self.http, "POST", "/v1/check", body)
        except urllib.error.HTTPError as e:
            if e.code == 429:
                return None
            raise

    def admin_call(self, method, path, body=None):
        return self.call(self.admin, method, path, body, TOKEN)


def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in ["--headless=new", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--no-first-run", "--disable-sync",
                "--disable-dev-shm-usage", "--disable-extensions", "--disable-default-apps",
                "--no-default-browser-check", "--disable-features=Translate,MediaRouter",
                f"--window-size={DESKTOP[0]},{DESKTOP[1]}"]:
        options.add_argument(arg)
    if os.geteuid() == 0:
        options.add_argument("--no-sandbox")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # The driver is Debian's: Selenium Manager (which downloads drivers) is never asked.
    return webdriver.Chrome(service=Service(executable_path="/usr/bin/chromedriver"),
                            options=options)


def severe(driver):
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def wait_for(driver, what, predicate, timeout=20):
    # The page redraws its cards and tables on every poll: an element found just before a
    # redraw goes stale, and a value read mid-redraw may not parse yet. Both mean "not yet",
    # as a missing element does, rather than failing the wait at once.
    not_yet = (NoSuchElementException, StaleElementReferenceException, ValueError)
    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.2,
                             ignored_exceptions=not_yet).until(lambda d: predicate(d))
    except Exception:
        fail(f"{what} did not show within {timeout} s; console: {driver.get_log('browser')}")


def screenshots(driver, out, size):
    driver.set_window_size(*size)
    time.sleep(0.5)
    name = "desktop" if size == DESKTOP else "phone"
    for view in VIEWS:
        # The view at the top of the window, below the sticky header, as a reader sees it.
        driver.execute_script(
            "const s = document.getElementById(arguments[0]);"
            "const h = document.querySelector('header').offsetHeight;"
            "window.scrollTo(0, s.getBoundingClientRect().top + window.scrollY - h - 8);", view)
        time.sleep(0.2)
        driver.save_screenshot(str(out / f"{view}-{name}.png"))
    driver.execute_script("window.scrollTo(0, 0)")


def text(driver, selector):
    return driver.find_element(By.CSS_SELECTOR, selector).text


def main():
    if len(sys.argv) < 2:
        fail(__doc__)
    binary = sys.argv[1]
    repo = Path(__file__).resolve().parents[2]
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else repo / "target" / "dashboard"
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as workdir:
        server = Tollgate(binary, workdir)
        driver = None
        steady = threading.Event()
        try:
            # Version 2 is running; the page rolls back to 1.
            pushed = server.admin_call("POST", "/v1/admin/policy", {"sources": [
                {"name": "policy.yaml", "text": POLICY.replace("LIMIT", "4")}]})
            assert pushed["version"]["seq"] == 2, pushed

            # The known workload, on the shadow rule: limit 2 a day per (tenant, user), never
            # denied. acme/a: 10 requests, 8 would be denied; acme/b: 2, none; globex/c: 1,
            # none. acme: 8 of 12 would be denied (67%), globex: 0%.
            for tenant, user, n in [("acme", "a", 10), ("acme", "b", 2), ("globex", "c", 1)]:
                for _ in range(n):
                    answer = server.check([[("tenant", tenant), ("user", user)]])
                    assert answer is not None, "a shadow rule denied"

            # Steady traffic on the enforced rule while the page is looked at, so the rates
            # of "now" move: user=steady is allowed 4 times, then denied.
            def steady_traffic():
                while not steady.is_set():
                    server.check([[("user", "steady")]])
                    time.sleep(0.05)
            threading.Thread(target=steady_traffic, daemon=True).start()

            driver = browser()
            driver.get(f"http://{server.admin}/")
            # Without a token stored the snapshot is refused, and the page asks for one.
            form = wait_for(driver, "the token form",
                            lambda d: d.find_element(By.ID, "token-form").is_displayed()
                            and d.find_element(By.ID, "token-form"))
            # That refusal is the one console line allowed: Chrome reports every 401 fetch.
            for entry in severe(driver):
                if not ("dashboard/snapshot" in entry["message"] and "401" in entry["message"]):
                    fail(f"console error on load: {entry}")
            driver.find_element(By.ID, "token-input").send_keys(TOKEN)
            form.submit()

            # The traffic sent: the rules' rows, denials per second now, the top keys.
            wait_for(driver, "the per-rule table",
                     lambda d: d.find_elements(By.CSS_SELECTOR, '#rules tr[data-rule="api/per_user"]'))
            wait_for(driver, "denials per second",
                     lambda d: float(text(d, "#now-denied .value")) > 0)
            wait_for(driver, "allowed per second",
                     lambda d: float(text(d, "#now-allowed .value")) >= 0)
            wait_for(driver, "the steady user among the top denied keys",
                     lambda d: d.find_elements(By.CSS_SELECTOR, '#top tr[data-key="user=steady"]'))
            wait_for(driver, "decision latency",
                     lambda d: "ms" in d.find_element(By.ID, "cards").text)

            # The shadow rule's per-tenant share, for the workload above.
            acme = wait_for(driver, "acme's would-deny share",
                            lambda d: d.find_elements(By.CSS_SELECTOR, '#shadow tr[data-rollup="tenant=acme"]'))[0]
            if acme.get_attribute("data-share") != "0.6667" or "would have denied 67% of tenant=acme's requests" not in acme.text:
                fail(f"acme's share: {acme.get_attribute('data-share')} {acme.text!r}")
            globex = driver.find_element(By.CSS_SELECTOR, '#shadow tr[data-rollup="tenant=globex"]')
            if globex.get_attribute("data-share") != "0.0000" or "0%" not in globex.text:
                fail(f"globex's share: {globex.text!r}")
            user_a = driver.find_element(By.CSS_SELECTOR, '#shadow tr[data-value="tenant=acme,user=a"]')
            if user_a.get_attribute("data-share") != "0.8000":
                fail(f"acme/a's share: {user_a.text!r}")
            # The same from the bounded sketch (exact below its capacity), labelled as counted
            # since tracking began.
            sketch = driver.find_element(By.CSS_SELECTOR, '#shadow tr[data-sketch-rollup="tenant=acme"]')
            if sketch.get_attribute("data-share") != "0.6667":
                fail(f"acme's share in the sketch: {sketch.text!r}")
            if "counted since tracking began" not in text(driver, '[data-shadow-rule="api/per_tenant_user"] .sketch'):
                fail("the sketch's label")
            overall = driver.find_element(By.CSS_SELECTOR, '[data-shadow-rule="api/per_tenant_user"] [data-overall-share]')
            if "62%" not in overall.text:  # 8 of 13
                fail(f"the shadow rule's overall share: {overall.text!r}")

            # Health: the memory store, reachable; version 2 running.
            wait_for(driver, "the store", lambda d: "memory" in text(d, "#health-store"))
            wait_for(driver, "version 2 running",
                     lambda d: d.find_element(By.ID, "version").get_attribute("data-seq") == "2")

            screenshots(driver, out, DESKTOP)
            screenshots(driver, out, PHONE)
            driver.set_window_size(*DESKTOP)

            # A rollback from the page: two clicks, then the running version changes.
            button = driver.find_element(By.CSS_SELECTOR, 'button[data-rollback="1"]')
            driver.execute_script("arguments[0].scrollIntoView()", button)
            button.click()
            confirm = wait_for(driver, "the rollback confirmation",
                               lambda d: d.find_element(By.CSS_SELECTOR, 'button[data-confirm-rollback="1"]'))
            confirm.click()
            wait_for(driver, "version 3 (the rollback) running",
                     lambda d: d.find_element(By.ID, "version").get_attribute("data-seq") == "3")
            wait_for(driver, "the rollback's result",
                     lambda d: "Roll back to 1: activated" in text(d, "#action-result"))
            running = server.admin_call("GET", "/v1/admin/policy")
            current = [v for v in running["versions"] if v["current"]][0]
            if running["current"] != 3 or current["origin"] != "rollback":
                fail(f"after the rollback: {running}")

            # The diff of versions 1 and 2 from the page.
            driver.find_element(By.ID, "diff-from").send_keys("1")
            driver.execute_script(
                "document.getElementById('diff-from').value='1';"
                "document.getElementById('diff-to').value='2';")
            driver.find_element(By.ID, "diff-button").click()
            wait_for(driver, "the diff", lambda d: "requests_per_unit: 4" in text(d, "#diff"))

            errors = severe(driver)
            if errors:
                fail(f"console errors: {errors}")
            driver.save_screenshot(str(out / "page-desktop.png"))
            print(f"ok: dashboard browser test; screenshots in {out}")
        finally:
            steady.set()
            if driver is not None:
                driver.quit()
            server.stop()


if __name__ == "__main__":
    main()
