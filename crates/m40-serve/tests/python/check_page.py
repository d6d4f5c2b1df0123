"""The chat page at / in a real browser (headless Chromium from Debian's
packages, driven by Selenium from PyPI): the page loads and lists the
server's model, a message streams an answer (rendered, with its speed and
where it ran), and Stop ends an answer that is streaming.

Usage: check_page.py BASE_URL BRIEF LONG CHROMIUM CHROMEDRIVER
(BRIEF: a stored model whose answers are short; LONG: a loaded model whose
answers run long enough to stop one.)
"""

import sys
import time

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

base, brief, long_model, chromium, chromedriver = sys.argv[1:6]

opts = webdriver.ChromeOptions()
opts.binary_location = chromium
for flag in [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]:
    opts.add_argument(flag)
driver = webdriver.Chrome(service=Service(chromedriver), options=opts)
wait = WebDriverWait(driver, 60)
checks = 0


def check(cond, what):
    global checks
    if not cond:
        print("FAILED:", what, flush=True)
        print(driver.find_element(By.ID, "log").get_attribute("innerHTML")[:4000])
        driver.quit()
        sys.exit(1)
    checks += 1


try:
    driver.get(base + "/")
    check(driver.title == "m40-llm", f"title {driver.title!r}")
    # The model list comes from /api/tags and /api/ps.
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#model option"))
    names = [o.get_attribute("value") for o in driver.find_elements(By.CSS_SELECTOR, "#model option")]
    check(brief in names and long_model in names, f"{brief} and {long_model} in {names}")
    texts = [o.text for o in driver.find_elements(By.CSS_SELECTOR, "#model option")]
    check(long_model + " (loaded)" in texts, f"the loaded model marked: {texts}")

    def pick(name):
        Select(driver.find_element(By.ID, "model")).select_by_value(name)

    def send(text):
        box = driver.find_element(By.ID, "input")
        box.clear()
        box.send_keys(text)
        driver.find_element(By.ID, "send").click()

    def answers():
        return driver.find_elements(By.CSS_SELECTOR, ".msg.assistant")

    # A message to a model not loaded yet: it loads, and a streamed,
    # rendered answer comes with its speed and backend.
    pick(brief)
    send("Say hello.")
    wait.until(lambda d: answers() and answers()[-1].get_attribute("data-state") != "streaming")
    last = answers()[-1]
    check(last.get_attribute("data-state") == "done", f"state {last.get_attribute('data-state')}")
    body = last.find_element(By.CLASS_NAME, "body").text
    check(len(body.strip()) > 0, "an answer")
    meta = last.find_element(By.CLASS_NAME, "meta")
    wait.until(lambda d: " on " in meta.text)
    check("tokens/s" in meta.text and "CPU" in meta.text, f"meta {meta.text!r}")
    check(driver.find_element(By.CSS_SELECTOR, ".msg.user").text == "Say hello.", "the message shown")

    # Stop: a long answer, stopped while it streams.
    pick(long_model)
    driver.find_element(By.TAG_NAME, "summary").click()
    system = driver.find_element(By.ID, "system")
    system.send_keys("Write at length, never stop.")
    send("Tell me a very long story about the sea.")
    wait.until(lambda d: len(answers()) == 2 and answers()[-1].find_element(By.CLASS_NAME, "body").text)
    check(not driver.find_element(By.ID, "stop").get_attribute("disabled"), "Stop enabled while streaming")
    driver.find_element(By.ID, "stop").click()
    wait.until(lambda d: answers()[-1].get_attribute("data-state") != "streaming")
    check(answers()[-1].get_attribute("data-state") == "stopped", f"state {answers()[-1].get_attribute('data-state')}")
    check(driver.find_element(By.ID, "send").is_enabled(), "Send enabled again")
    # The chat goes on after a stop.
    pick(brief)
    send("Thanks.")
    wait.until(lambda d: len(answers()) == 3 and answers()[-1].get_attribute("data-state") != "streaming")
    check(answers()[-1].get_attribute("data-state") == "done", "the chat goes on")

    # Markdown is rendered and HTML in an answer stays text (the renderer,
    # fed directly).
    html = driver.execute_script(
        "return markdown('# T\\n**b** `c` <script>x</script>\\n- one\\n- two\\n```\\nfn main() {}\\n```');"
    )
    check("<h1>T</h1>" in html and "<strong>b</strong>" in html and "<code>c</code>" in html, html)
    check("&lt;script&gt;" in html and "<script>" not in html, html)
    check("<ul><li>one</li><li>two</li></ul>" in html and "<pre><code>fn main() {}</code></pre>" in html, html)
finally:
    driver.quit()

print(f"{checks} checks passed")
