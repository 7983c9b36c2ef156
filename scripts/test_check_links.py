#!/usr/bin/env python3
"""Tests of scripts/check-links.py on the fixture in scripts/check-links-fixture/.
Usage: python3 scripts/test_check_links.py"""

import contextlib
import importlib.util
import io
import tempfile
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
SPEC = importlib.util.spec_from_file_location("check_links", HERE / "check-links.py")
check_links = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(check_links)

FIXTURE = HERE / "check-links-fixture"


class Slugs(unittest.TestCase):
    def test_mdbook_rules(self):
        # mdbook-html's own test case, then punctuation, case, dots and underscores.
        self.assertEqual(
            check_links.slug("--passes: add more rustdoc passes"),
            "--passes-add-more-rustdoc-passes",
        )
        self.assertEqual(check_links.slug("A worked 3 a.m. example"), "a-worked-3-am-example")
        self.assertEqual(check_links.slug("HTTP API (default 127.0.0.1:8080)"), "http-api-default-1270018080")
        self.assertEqual(check_links.slug(" local_budget "), "local_budget")

    def test_heading_markup_is_dropped(self):
        self.assertEqual(check_links.heading_id("The flag `--store`"), "the-flag---store")
        self.assertEqual(check_links.heading_id("**Bold** and [a link](x.md)"), "bold-and-a-link")
        self.assertEqual(check_links.heading_id("Custom {#my-id}"), "my-id")

    def test_repeated_headings_are_numbered(self):
        self.assertEqual(check_links.unique(["a", "a", "a", "b"]), ["a", "a-1", "a-2", "b"])


class Fixture(unittest.TestCase):
    def test_reports_exactly_the_broken_links(self):
        problems = check_links.check(FIXTURE)
        self.assertEqual(
            sorted(problems),
            sorted([
                "README.md:7: docs/missing.md: no such file",
                "README.md:7: docs/page.md#nowhere: no heading with id #nowhere",
                "docs/page.md:14: data.txt#top: an anchor into a file that is not Markdown",
                "docs/page.md:14: #notes-2: no heading with id #notes-2",
                "docs/page.md:22: ../nowhere.md: no such file",
            ]),
        )

    def test_exit_status(self):
        with contextlib.redirect_stderr(io.StringIO()) as err:
            self.assertEqual(check_links.main(["check-links.py", str(FIXTURE)]), 1)
        self.assertIn("5 broken link(s) in 2 page(s)", err.getvalue())
        with tempfile.TemporaryDirectory() as root:
            (Path(root) / "docs").mkdir()
            (Path(root) / "README.md").write_text("# Top\n\nSee [the page](docs/a.md#a-b).\n")
            (Path(root) / "docs" / "a.md").write_text("# A\n\n## A `b`\n\n[up](../README.md#top)\n")
            self.assertEqual(check_links.check(root), [])
            with contextlib.redirect_stdout(io.StringIO()):
                self.assertEqual(check_links.main(["check-links.py", root]), 0)


if __name__ == "__main__":
    unittest.main()
