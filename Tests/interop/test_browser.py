"""The demo page and presence.js in a real browser (Debian's headless Chromium driven by selenium) against a
3-node cluster: two pages in one channel see each other join, set state and leave; the node one page is on
is killed and the page resumes on another node with nothing seen by the other page. A screenshot of the
demo page is saved as a test artifact. Every wait is bounded."""
import os
import shutil
import time

from test_cluster import Cluster, wait_until

ARTIFACTS = os.environ.get("PRESENCED_ARTIFACTS", "/tmp/presenced-artifacts")
TIMEOUT = 2.0   # the cluster's --presence-timeout (test_cluster.Cluster)


def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1100,900",
                 "--disable-background-timer-throttling", "--disable-renderer-backgrounding"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(executable_path=shutil.which("chromedriver")), options=options)


class Page:
    """One demo page: its user, and what the page shows."""

    def __init__(self, driver, node, servers, user, channel="lobby"):
        self.d = driver
        self.user = user
        urls = ",".join(f"ws://127.0.0.1:{n.http_port}/v1/ws" for n in servers)
        driver.get(f"http://127.0.0.1:{node.http_port}/?servers={urls}&user={user}&channel={channel}")
        wait_until(f"{user}'s page loaded", lambda: self.js("return !!window.presenceDemo"), 15)

    def js(self, script):
        return self.d.execute_script(script)

    def click(self, element_id):
        self.d.find_element("id", element_id).click()

    def state(self):
        return self.js("return window.presenceDemo.client ? window.presenceDemo.client.connectionState : 'none'")

    def roster(self):
        """The roster table as the page shows it: user -> state text."""
        rows = self.js("""return [...document.querySelectorAll('#roster tr')].map(
            tr => [tr.dataset.user, tr.querySelector('.state').textContent])""")
        return dict(rows)

    def log(self):
        return self.js("return document.getElementById('log').textContent")


def test_two_pages_see_each_other_and_one_survives_its_node_being_killed():
    assert shutil.which("chromium") and shutil.which("chromedriver"), "Scripts/ensure-deps installs Debian's chromium and chromium-driver"
    cluster = Cluster(3, total=3)
    drivers = []
    try:
        n0, n1, n2 = (cluster.nodes[i] for i in range(3))
        drivers = [browser(), browser()]
        # alice's page comes from node 0 and may fail over to node 1; bob's is on node 2
        alice = Page(drivers[0], n0, [n0, n1], "alice")
        bob = Page(drivers[1], n2, [n2], "bob")
        for page in (alice, bob):
            page.click("connect")
            wait_until(f"{page.user} connected", lambda: page.state() == "connected", 15)
            page.click("join")
        wait_until("each page lists both users", lambda: set(alice.roster()) == {"alice", "bob"} and set(bob.roster()) == {"alice", "bob"}, 15)
        # state set on one page shows on the other
        alice.d.find_element("id", "key").clear()
        alice.d.find_element("id", "key").send_keys("mic")
        alice.d.find_element("id", "value").clear()
        alice.d.find_element("id", "value").send_keys("on")
        alice.click("set")
        wait_until("bob's page shows alice's mic", lambda: bob.roster().get("alice") == "mic=on", 10)
        os.makedirs(ARTIFACTS, exist_ok=True)
        drivers[1].save_screenshot(os.path.join(ARTIFACTS, "demo-page.png"))

        # kill -9 the node alice's page is on: it resumes on node 1, and bob sees nothing
        n0.kill()
        wait_until("alice's page resumed on node 1",
                   lambda: alice.state() == "connected" and alice.js("return window.presenceDemo.client.server").endswith(f":{n1.http_port}/v1/ws"), 20)
        time.sleep(TIMEOUT + 1.0)   # past the presence timeout: a lost session would have timed out by now
        assert "alice" in bob.roster() and bob.roster()["alice"] == "mic=on"
        assert "remote_leave alice" not in bob.log() and "remote_timeout alice" not in bob.log()
        # and the resumed session still acts: a state change after the failover reaches bob
        alice.d.find_element("id", "value").clear()
        alice.d.find_element("id", "value").send_keys("off")
        alice.click("set")
        wait_until("bob's page shows alice's mic off", lambda: bob.roster().get("alice") == "mic=off", 10)

        # alice leaves: bob's page drops her
        alice.click("leave")
        wait_until("bob's page without alice", lambda: set(bob.roster()) == {"bob"}, 10)
        assert "remote_leave alice" in bob.log()
    finally:
        for d in drivers:
            d.quit()
        cluster.stop()
