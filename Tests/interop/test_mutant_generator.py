"""Scripts/swift_mutants.py, the generator behind `Scripts/mutate --generate` (issue 37): what it
mutates, what it must leave alone (comments, strings, generics, logging), and that a seed picks the
same sample every time."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "Scripts"))
import swift_mutants  # noqa: E402

SOURCE = '''
import Foundation

// if a < b { never mutated: a comment }
/* nested /* a && b */ still a comment: x == y */
struct Box<Element>: Sendable {
    var items: [Element] = []
    let label = "a < b && c == d"
    let page = """
        if x > y { return }
        """

    mutating func add(_ e: Element, limit: Int) -> Bool {
        if items.count >= limit {
            return false
        }
        items.append(e)
        logger.info("added \\(items.count < limit)")
        assert(items.count <= limit)
        return true
    }

    func check(a: Int, b: Int?) {
        if let b, b > a { return }
        guard a != 0 else { return }
        try validate(a + 1)
    }

    func name(_ k: Kind) -> String {
        switch k {
        case .one: "one"
        case .two: "two"
        }
    }
}
'''


def mutants_of(text, tmp_path, name="Box.swift"):
    path = tmp_path / name
    path.write_text(text)
    return swift_mutants.mutants_of_file(str(path), f"Sources/Demo/{name}", "Demo")


def edits(ms, kind):
    return sorted((m.before.strip(), m.after.strip()) for m in ms if m.kind == kind)


def test_operators_in_code_are_mutated_and_never_in_comments_strings_or_generics(tmp_path):
    ms = mutants_of(SOURCE, tmp_path)
    assert edits(ms, "relational") == sorted([
        ("if items.count >= limit {", "if items.count > limit {"),
        ("if let b, b > a { return }", "if let b, b >= a { return }"),
        ("guard a != 0 else { return }", "guard a == 0 else { return }"),
    ])
    assert edits(ms, "logical") == []
    assert edits(ms, "off-by-one") == [("try validate(a + 1)", "try validate(a + 0)")]
    assert edits(ms, "boolean") == sorted([("return false", "return true"), ("return true", "return false")])


def test_a_condition_is_negated_only_when_it_is_one_expression(tmp_path):
    ms = mutants_of(SOURCE, tmp_path)
    assert edits(ms, "negate") == sorted([
        ("if items.count >= limit {", "if !(items.count >= limit) {"),
        ("guard a != 0 else { return }", "guard !(a != 0) else { return }"),
    ])


def test_a_call_statement_is_removed_but_not_a_log_line_or_an_assertion(tmp_path):
    ms = mutants_of(SOURCE, tmp_path)
    assert edits(ms, "remove-call") == sorted([("items.append(e)", ""), ("try validate(a + 1)", "")])
    assert edits(ms, "try-optional") == [("try validate(a + 1)", "_ = try? validate(a + 1)")]
    assert edits(ms, "early-return") == [("func check(a: Int, b: Int?) {", "func check(a: Int, b: Int?) { return;")]


def test_code_inside_a_string_literal_is_never_mutated(tmp_path):
    text = 'let page = """\n    try { await leave(); } catch (_) {}\n    send(x)\n    case .a:\n    case .b:\n    """\n// send(y)\n'
    assert mutants_of(text, tmp_path) == []


def test_neighbouring_arms_of_one_switch_exchange_their_patterns(tmp_path):
    ms = [m for m in mutants_of(SOURCE, tmp_path) if m.kind == "swap-case"]
    assert len(ms) == 1
    src = (tmp_path / "Box.swift").read_text()
    out = ms[0].apply(src)
    assert 'case .two: "one"' in out and 'case .one: "two"' in out


def test_arms_of_two_switches_are_never_swapped(tmp_path):
    text = "func f() {\n    switch a {\n    case .x: go()\n    }\n    switch b {\n    case .y: go()\n    }\n}\n"
    assert [m for m in mutants_of(text, tmp_path) if m.kind == "swap-case"] == []


def test_ids_stay_when_other_lines_move(tmp_path):
    before = {m.id: m.before for m in mutants_of(SOURCE, tmp_path)}
    moved = SOURCE.replace("import Foundation\n", "import Foundation\nimport Synchronization\n\n")
    after = {m.id: m.before for m in mutants_of(moved, tmp_path)}
    assert before == after


def test_the_same_seed_picks_the_same_sample_and_another_seed_another(tmp_path):
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    every = swift_mutants.all_mutants(root)
    assert len(every) > 1000
    assert not any("/Generated/" in m.file for m in every)
    first = [m.id for m in swift_mutants.sample(every, 40, "abc")]
    again = [m.id for m in swift_mutants.sample(every, 40, "abc")]
    other = [m.id for m in swift_mutants.sample(every, 40, "abd")]
    assert first == again and len(set(first)) == 40
    assert first != other
    # each one applies to its file and changes it
    for m in swift_mutants.sample(every, 40, "abc"):
        src = open(os.path.join(root, m.file), encoding="utf-8").read()
        assert m.apply(src) != src
