"""The post-import hook the OpenRLHF and veRL adapters patch trainer modules with."""

from rlstab.adapters.post_import import when_imported


def test_when_imported_runs_after_the_import_or_at_once(tmp_path, monkeypatch):
    (tmp_path / "rlstab_probe_module.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    when_imported("rlstab_probe_module", lambda m: seen.append(m.VALUE))
    assert seen == []
    import rlstab_probe_module  # noqa: F401

    assert seen == [1]
    when_imported("rlstab_probe_module", lambda m: seen.append(m.VALUE + 1))
    assert seen == [1, 2]
