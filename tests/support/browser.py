"""Debian's chromium driven through chromedriver by selenium, as the web console's tests use it
(tests/registry/console, and through the compose gateway and the Helm chart in tests/deploy);
axe-core (npm, installed by scripts/setup.sh into node_modules/) injected into a page to check it.

Headless with a fresh profile and every background feature that would reach the network off
(this machine has no internet; chromium would otherwise try it at start)."""
from __future__ import annotations

import base64
import contextlib
import hashlib
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

from tests.support.ci import cannot_run, require_module
from tests.support.procs import REPO, wait_until

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
AXE = REPO / "node_modules" / "axe-core" / "axe.min.js"
SERIOUS = ("serious", "critical")
FOCUSABLE = ("a[href], button:not([disabled]), input:not([type=hidden]):not([disabled]), select:not([disabled]), "
             "textarea:not([disabled]), [tabindex]:not([tabindex='-1'])")


def start_chromium(profile: Path, trust_spki: tuple[str, ...] = ()):
    """A headless chromium (``webdriver.Chrome``), or the suite's rule when it cannot start here.

    ``trust_spki``: base64 SHA-256 hashes of public keys (``spki_hash``) whose certificates this
    browser accepts, as a self-made CA of a test stack, and nothing else beyond its usual trust."""
    webdriver = require_module("selenium.webdriver")
    for exe in (CHROMIUM, CHROMEDRIVER):
        if not Path(exe).exists() and not shutil.which(Path(exe).name):
            cannot_run(f"{exe} is missing: scripts/setup.sh installs Debian's chromium and chromium-driver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                 f"--user-data-dir={profile}", "--window-size=1280,1000"):
        options.add_argument(flag)
    if trust_spki:
        options.add_argument(f"--ignore-certificate-errors-spki-list={','.join(trust_spki)}")
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.get = _steady_get(driver)
    return driver


def _steady_get(driver, patience_s: float = 45.0):
    """``driver.get`` that loads the page again when Chromium showed its own error page instead.

    Chromium aborts a navigation, localhost included, with ERR_NETWORK_CHANGED when any interface of
    the host comes or goes (a container network, a Kubernetes bridge or veth of another suite on the same
    machine; Chromium has no switch to ignore it), and such changes come in bursts of several seconds.
    That is the machine's doing, not the console's: the page is asked for again, with growing pauses,
    for up to ``patience_s``; a console that really fails still fails."""
    plain = driver.get

    def get(url: str) -> None:
        deadline, pause = time.monotonic() + patience_s, 0.5
        while True:
            plain(url)
            if not failed_here(driver) or time.monotonic() > deadline:
                return
            code = driver.execute_script("return (document.body.innerText.match(/ERR_[A-Z_]+/) || [''])[0];")
            print(f"\n{time.strftime('%H:%M:%S')} Chromium's error page {code or '?'} instead of {url}: loading it again")
            time.sleep(pause)
            pause = min(pause * 2, 5.0)
    return get


def failed_here(driver) -> bool:
    """Whether the tab shows Chromium's own network-error page ("Your connection was interrupted"):
    at chrome-error://, or under the address it failed to load (then only its markup tells)."""
    return driver.current_url.startswith("chrome-error://") or bool(driver.execute_script(
        "return document.getElementById('main-frame-error') !== null || "
        "document.documentElement.classList.contains('neterror');"))


@contextlib.contextmanager
def chromium(trust_spki: tuple[str, ...] = ()) -> Iterator:
    """A started chromium with the console tests' timeouts, quit at the end."""
    profile = fresh_profile()
    driver = start_chromium(profile, trust_spki)
    driver.set_page_load_timeout(60)
    driver.set_script_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)  # a few MB a browser: kept, they filled the temp folder


def spki_hash(certificate_pem: bytes) -> str:
    """What ``--ignore-certificate-errors-spki-list`` takes: base64 of the SHA-256 of a
    certificate's SubjectPublicKeyInfo (DER)."""
    if shutil.which("openssl") is None:
        cannot_run("openssl is missing (Debian: openssl; deploy/init-env.sh needs it too)")
    key = subprocess.run(["openssl", "x509", "-pubkey", "-noout"], input=certificate_pem, capture_output=True,
                         check=True, timeout=30).stdout
    der = subprocess.run(["openssl", "pkey", "-pubin", "-outform", "DER"], input=key, capture_output=True,
                         check=True, timeout=30).stdout
    return base64.b64encode(hashlib.sha256(der).digest()).decode()


def sign_in(driver, console_url: str, token: str) -> None:
    """Sign in to the console at ``console_url`` (…/console) with an API token, by keyboard."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    driver.delete_all_cookies()
    driver.get(f"{console_url}/signin")
    field = driver.find_element(By.ID, "token")
    field.send_keys(token)
    field.send_keys(Keys.ENTER)  # the keyboard signs in
    wait_until(lambda: driver.find_elements(By.CSS_SELECTOR, "nav[aria-label=Pages]"), timeout=20, what="signed in",
               on_timeout=lambda: driver.find_element(By.TAG_NAME, "body").text[:1500])


REPLACED_DOCUMENT = ("does not belong to the document", "No node with given id found")


def shown(driver, element_id: str, containing: str = "", timeout: float = 30.0):
    """The element once the page a click started shows it (with ``containing`` in its text): a click
    returns before the next page has replaced this one."""
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
    from selenium.webdriver.common.by import By

    def found():
        try:
            for element in driver.find_elements(By.ID, element_id):
                if containing in element.text:
                    return element
        except StaleElementReferenceException:  # the old page's element, replaced meanwhile
            pass
        except WebDriverException as exc:
            # Chromium reports the same race this way when the next page replaces the document
            # between finding the element and reading its text.
            if not any(m in str(exc) for m in REPLACED_DOCUMENT):
                raise
        return None

    return wait_until(found, timeout=timeout, what=f"#{element_id} showing {containing!r}",
                      on_timeout=lambda: driver.find_element(By.TAG_NAME, "body").text[:1500])


def axe_violations(driver) -> list[dict]:
    """axe-core's serious and critical violations on the page now loaded."""
    if not AXE.exists():
        cannot_run(f"{AXE} is missing: scripts/setup.sh runs `npm install` (package.json: axe-core)")
    driver.execute_script(AXE.read_text())
    result = driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "axe.run(document, {resultTypes: ['violations']}).then(r => done(r.violations), e => done([{id: 'axe failed', "
        "impact: 'critical', description: String(e), nodes: []}]));")
    return [{"id": v["id"], "impact": v["impact"], "description": v["description"],
             "where": [n.get("target") for n in v.get("nodes", [])][:5]}
            for v in result if v.get("impact") in SERIOUS]


def tab_walk(driver, limit: int = 200) -> tuple[list[str], list[str]]:
    """Press Tab from the top of the page until the focus comes round again: the elements reached
    (as identifiers), and every focusable, visible element the page has (same identifiers)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    describe = ("const e = arguments[0] || document.activeElement; return e.tagName + '|' + (e.id || e.name || '') + '|' + "
                "(e.getAttribute('href') || e.getAttribute('formaction') || e.getAttribute('value') || '') + '|' + "
                "(e.textContent || '').trim().slice(0, 40);")
    everything = [driver.execute_script(describe, e) for e in driver.find_elements(By.CSS_SELECTOR, FOCUSABLE)
                  if e.is_displayed()]
    driver.execute_script("document.activeElement && document.activeElement.blur(); window.scrollTo(0, 0);")
    body = driver.find_element(By.TAG_NAME, "body")
    body.send_keys(Keys.TAB)  # the first Tab from nowhere lands on the page's first element
    reached: list[str] = []
    for _ in range(limit):
        here = driver.execute_script(describe)
        if reached and here == reached[0]:
            break
        if here not in reached:
            reached.append(here)
        driver.switch_to.active_element.send_keys(Keys.TAB)
    return reached, everything


def fresh_profile() -> Path:
    return Path(tempfile.mkdtemp(prefix="console-chromium-"))
