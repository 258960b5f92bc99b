"""Driving the ``ctxkit ui`` page in Debian's chromium (Selenium with chromium-driver, both from
apt: nothing downloaded at run time): a uvicorn server on a thread, a headless browser, and
waits on the page's own ``data-state`` marks. Used by tests/test_ui_browser.py and by
tests/ui_screenshots.py (the screenshots in docs/images)."""

import contextlib
import os
import shutil
import socket
import threading
import time

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")


def under_ci() -> bool:
    """CI sets ``CI=true`` (GitHub Actions, GitLab, .ci/run's caller)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def missing_browser() -> list:
    """What the browser tests lack here (empty: they can run)."""
    missing = []
    if CHROMIUM is None:
        missing.append("chromium (apt-get install -y chromium)")
    if DRIVER is None:
        missing.append("chromedriver (apt-get install -y chromium-driver)")
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (pip install -e '.[test]')")
    return missing


@contextlib.contextmanager
def serving(app):
    """``app`` served by uvicorn on a free port of 127.0.0.1, on a thread: yields the base URL."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="ui-test-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@contextlib.contextmanager
def chromium(width: int = 1280, height: int = 2000):
    """A headless chromium through Debian's chromedriver, keeping the console's messages."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--no-first-run",
                f"--window-size={width},{height}", "--force-device-scale-factor=1", "--disable-extensions"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=DRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(driver, script: str, timeout: float = 20.0, every: float = 0.02):
    """Run ``script`` (JavaScript returning a value) until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while True:
        value = driver.execute_script(script)
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for: {script}")
        time.sleep(every)


def panel_state(driver, panel: str) -> str:
    return driver.execute_script(f"return document.getElementById('panel-{panel}').dataset.state")


def submit(driver, panel: str, fields: dict = None, timeout: float = 30.0) -> str:
    """Fill a panel's form fields (name -> value, set as a user's input events would), press
    its submit button and wait until the panel is ``done`` or ``error``; returns the state."""
    for name, value in (fields or {}).items():
        driver.execute_script(
            "const f = document.querySelector(`#panel-${arguments[0]} form`); const e = f.elements[arguments[1]];"
            "e.value = arguments[2]; e.dispatchEvent(new Event('input', {bubbles: true}));"
            "e.dispatchEvent(new Event('change', {bubbles: true}));", panel, name, str(value))
    driver.find_element("css selector", f"#panel-{panel} button[type=submit]").click()
    return wait_for(driver, f"const s = document.getElementById('panel-{panel}').dataset.state;"
                            "return (s === 'done' || s === 'error') && s;", timeout=timeout)


def severe_console_messages(driver) -> list:
    """The console's errors since the last call (chromedriver hands each message out once)."""
    return [entry for entry in driver.get_log("browser") if entry.get("level") == "SEVERE"]
