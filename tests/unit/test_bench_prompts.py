import pytest

from gptoss_spark.bench.prompts import load_prompts
from gptoss_spark.base.errors import UserError


def test_shipped_prompts_cover_the_required_mix():
    prompts = load_prompts()
    assert {p.lang for p in prompts} >= {"en", "de"}
    assert {p.kind for p in prompts} >= {"chat", "code", "arithmetic"}
    assert {(p.lang, p.kind) for p in prompts} >= {("en", "chat"), ("de", "chat")}
    assert len({p.id for p in prompts}) == len(prompts)
    for p in prompts:
        assert p.messages[-1]["role"] == "user" and p.completion_text().strip()


@pytest.mark.parametrize("line, expected", [
    ("not json", "not valid JSON"),
    ('{"messages": [{"role": "user", "content": "x"}]}', 'missing "id"'),
    ('{"id": "a", "messages": []}', '"messages" must be a non-empty list'),
    ('{"id": "a", "messages": [{"role": "robot", "content": "x"}]}', '"role"'),
    ('{"id": "a", "messages": [{"role": "user", "content": 3}]}', "string \"content\""),
])
def test_bad_lines_name_file_line_and_fix(tmp_path, line, expected):
    f = tmp_path / "p.jsonl"
    f.write_text('{"id": "ok", "messages": [{"role": "user", "content": "x"}]}\n' + line + "\n")
    with pytest.raises(UserError) as e:
        load_prompts(f)
    msg = str(e.value)
    assert f"{f}:2" in msg and expected in msg and "\n" not in msg


def test_duplicate_ids_and_empty_and_missing_files(tmp_path):
    f = tmp_path / "p.jsonl"
    row = '{"id": "a", "messages": [{"role": "user", "content": "x"}]}\n'
    f.write_text(row + row)
    with pytest.raises(UserError, match="duplicate id"):
        load_prompts(f)
    f.write_text("# only a comment\n\n")
    with pytest.raises(UserError, match="no prompts"):
        load_prompts(f)
    with pytest.raises(UserError, match="cannot read prompts file"):
        load_prompts(tmp_path / "missing.jsonl")


def test_explicit_prompt_text_wins_for_completions(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"id": "a", "messages": [{"role": "user", "content": "x"}], "prompt": "raw text"}\n')
    assert load_prompts(f)[0].completion_text() == "raw text"
