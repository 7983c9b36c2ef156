"""Tests of scripts/check-layers.py on small fixture trees: it finds what it claims to find, and
nothing that only looks like an import. Run: python3 -m unittest discover -s scripts"""

import contextlib
import importlib.util
import io
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "check_layers", Path(__file__).with_name("check-layers.py")
)
check_layers = importlib.util.module_from_spec(_spec)
sys.modules["check_layers"] = check_layers
_spec.loader.exec_module(check_layers)


class Fixture:
    """A workspace in a temporary directory, written from {relative path: source}."""

    def __init__(self, files: dict[str, str]):
        self._dir = tempfile.TemporaryDirectory()
        self.root = Path(self._dir.name)
        for rel, text in files.items():
            path = self.root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(text))

    def problems(self) -> list[str]:
        return check_layers.check(self.root)

    def close(self) -> None:
        self._dir.cleanup()


def check(files: dict[str, str]) -> list[str]:
    fixture = Fixture(files)
    try:
        return fixture.problems()
    finally:
        fixture.close()


# A layered crate that follows its order: limiter uses store and policy, store uses policy and a
# leaf utility, and the root declares everything.
CLEAN_TOLLGATE = {
    "crates/tollgate/src/lib.rs": """
        pub mod clock;
        pub mod limiter;
        pub mod policy;
        pub mod store;
    """,
    "crates/tollgate/src/clock.rs": "pub struct Clock;\n",
    "crates/tollgate/src/policy/mod.rs": """
        mod limits;
        mod rule;
        pub use limits::MAX;
        pub use rule::Rule;
    """,
    "crates/tollgate/src/policy/limits.rs": "pub const MAX: usize = 1;\n",
    "crates/tollgate/src/policy/rule.rs": """
        use super::MAX;
        pub struct Rule([u8; MAX]);
    """,
    "crates/tollgate/src/store/mod.rs": """
        use crate::clock::Clock;
        use crate::policy::{self, Rule};
        pub fn open(_: &Clock, _: &Rule) -> usize { policy::MAX }
    """,
    "crates/tollgate/src/limiter/mod.rs": """
        use crate::store;
        pub fn check() -> usize { crate::policy::MAX + store::open as usize }
    """,
}


class CleanTree(unittest.TestCase):
    def test_a_tree_in_order_has_nothing_to_report(self):
        self.assertEqual(check(CLEAN_TOLLGATE), [])

    def test_a_child_using_its_parent_is_no_cycle(self):
        # Declaring a child is not importing it: rule.rs may use what policy/mod.rs defines.
        files = dict(CLEAN_TOLLGATE)
        files["crates/tollgate/src/policy/mod.rs"] = "mod rule;\npub const MAX: usize = 1;\n"
        files["crates/tollgate/src/store/mod.rs"] = "use crate::policy::MAX;\n"
        self.assertEqual(check(files), [])

    def test_a_parent_importing_its_child_back_is_a_cycle(self):
        # mod.rs re-exports Rule from rule.rs, and rule.rs imports MAX from mod.rs.
        files = dict(CLEAN_TOLLGATE)
        files["crates/tollgate/src/policy/mod.rs"] = (
            "mod rule;\npub use rule::Rule;\npub const MAX: usize = 1;\n"
        )
        self.assertEqual(
            check(files)[:3],
            [
                "crates/tollgate: cycle between 2 files: src/policy/mod.rs, src/policy/rule.rs",
                "    src/policy/mod.rs:2 -> src/policy/rule.rs (rule::Rule)",
                "    src/policy/rule.rs:2 -> src/policy/mod.rs (super::MAX)",
            ],
        )


class Cycles(unittest.TestCase):
    FILES = {
        "crates/kit/src/lib.rs": "mod proxy;\n",
        "crates/kit/src/proxy/mod.rs": "mod link;\nmod shared;\nmod mode;\n",
        "crates/kit/src/proxy/link.rs": """
            //! Uses [`Shared`](super::shared::Shared), in a doc comment: not an import.
            use super::shared::Shared;
            pub struct Link;
        """,
        "crates/kit/src/proxy/shared.rs": """
            pub struct Shared { links: Vec<super::link::Link> }
        """,
        "crates/kit/src/proxy/mode.rs": """
            /* crate::proxy::link is named in a comment, "crate::proxy::shared" in a string */
            const NAME: &str = "super::link::Link";
            pub enum Mode { Pass }
        """,
    }

    def test_two_files_that_import_each_other_are_reported_with_both_edges(self):
        problems = check(self.FILES)
        self.assertEqual(
            problems,
            [
                "crates/kit: cycle between 2 files: src/proxy/link.rs, src/proxy/shared.rs",
                "    src/proxy/link.rs:3 -> src/proxy/shared.rs (super::shared::Shared)",
                "    src/proxy/shared.rs:2 -> src/proxy/link.rs (super::link::Link)",
            ],
        )

    def test_a_longer_cycle_is_one_set(self):
        files = {
            "crates/kit/src/lib.rs": "mod a;\nmod b;\nmod c;\n",
            "crates/kit/src/a.rs": "use crate::b::B;\npub struct A;\n",
            "crates/kit/src/b.rs": "pub struct B(crate::c::C);\n",
            "crates/kit/src/c.rs": "pub struct C(Option<Box<crate::a::A>>);\n",
        }
        problems = check(files)
        self.assertEqual(
            problems[0], "crates/kit: cycle between 3 files: src/a.rs, src/b.rs, src/c.rs"
        )
        self.assertEqual(len(problems), 4, problems)

    def test_test_modules_and_non_code_do_not_count(self):
        files = {
            "crates/kit/src/lib.rs": """
                mod a;
                mod b;
                #[cfg(test)]
                mod fixtures;
            """,
            "crates/kit/src/a.rs": """
                use crate::b::B;
                pub struct A(B);

                #[cfg(test)]
                mod tests {
                    use super::*;
                    use crate::fixtures::make;
                }
            """,
            "crates/kit/src/b.rs": """
                pub struct B;
                const S: &str = r#"crate::a::A"#;
                const C: char = '"';
                fn f<'a>(x: &'a str) -> &'a str { x }

                #[cfg(test)]
                mod tests {
                    use super::*;
                    #[test]
                    fn t() { let _ = crate::a::A(B); }
                }
            """,
            "crates/kit/src/fixtures.rs": "pub fn make() -> crate::a::A { todo!() }\n",
        }
        self.assertEqual(check(files), [])

    def test_a_reexport_is_followed_to_the_file_that_defines_the_item(self):
        # lib.rs re-exports Thing from deep.rs; other.rs uses crate::Thing. That is an edge to
        # deep.rs (no cycle with lib.rs, which uses other.rs).
        files = {
            "crates/kit/src/lib.rs": "mod deep;\nmod other;\npub use deep::Thing;\npub use other::f;\n",
            "crates/kit/src/deep.rs": "pub struct Thing;\n",
            "crates/kit/src/other.rs": "use crate::Thing;\npub fn f(_: Thing) {}\n",
        }
        self.assertEqual(check(files), [])
        # Defined in lib.rs itself, it is a cycle.
        files["crates/kit/src/lib.rs"] = "mod other;\npub use other::f;\npub struct Thing;\n"
        problems = check(files)
        self.assertEqual(
            problems[0], "crates/kit: cycle between 2 files: src/lib.rs, src/other.rs"
        )


class Layers(unittest.TestCase):
    def test_an_upward_import_is_reported_with_its_line(self):
        files = dict(CLEAN_TOLLGATE)
        files["crates/tollgate/src/policy/rule.rs"] = """
            use super::MAX;
            use crate::limiter::check;
            pub struct Rule([u8; MAX]);
        """
        problems = check(files)
        self.assertIn(
            "crates/tollgate: against the layer order: src/policy/rule.rs:3 -> "
            "src/limiter/mod.rs (crate::limiter::check): `policy` may not import `limiter`, "
            "a higher layer",
            problems,
        )

    def test_a_path_in_code_counts_like_a_use(self):
        files = dict(CLEAN_TOLLGATE)
        files["crates/tollgate/src/lib.rs"] += "mod random;\n"
        files["crates/tollgate/src/random.rs"] = (
            "pub struct Seed;\nfn f() -> usize { crate::limiter::check() }\n"
        )
        problems = check(files)
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("src/random.rs:2 -> src/limiter/mod.rs", problems[0])
        self.assertIn("`random` may not import `limiter`", problems[0])

    def test_a_module_outside_the_order_is_unknown(self):
        files = dict(CLEAN_TOLLGATE)
        files["crates/tollgate/src/lib.rs"] += "pub mod policy_sync;\n"
        files["crates/tollgate/src/policy_sync.rs"] = "use crate::store::open;\n"
        problems = check(files)
        self.assertEqual(
            problems,
            [
                "crates/tollgate: unknown top-level module `policy_sync` (src/policy_sync.rs): "
                "not in the layer order"
            ],
        )

    def test_only_the_tollgate_crate_is_layered(self):
        files = {
            "crates/other/src/lib.rs": "mod policy;\nmod limiter;\n",
            "crates/other/src/policy.rs": "use crate::limiter::X;\n",
            "crates/other/src/limiter.rs": "pub struct X;\n",
        }
        self.assertEqual(check(files), [])

    def test_the_exit_status_says_whether_anything_was_found(self):
        clean = Fixture(CLEAN_TOLLGATE)
        dirty = Fixture(Cycles.FILES)
        quiet = io.StringIO()
        try:
            with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
                self.assertEqual(check_layers.main(["check-layers.py", str(clean.root)]), 0)
                self.assertEqual(check_layers.main(["check-layers.py", str(dirty.root)]), 1)
        finally:
            clean.close()
            dirty.close()


class UseTrees(unittest.TestCase):
    def test_braces_self_globs_and_renames_are_expanded(self):
        tokens = check_layers.TOKEN.findall("super::a::{self, b::{C, D as E}, *}")
        self.assertEqual(
            check_layers.parse_use_tree(tokens),
            [
                (("super", "a"), "a"),
                (("super", "a", "b", "C"), "C"),
                (("super", "a", "b", "D"), "E"),
                (("super", "a"), None),
            ],
        )


if __name__ == "__main__":
    unittest.main()
