"""core.optional_libraries: a missing library, one that breaks on import, and one that works, told apart."""

import sys

from amp_lessons.core.optional_libraries import library_support, torchao_support


def test_a_missing_library_says_how_to_install_it():
    support = library_support("amp_lessons_no_such_library")
    assert not support and "is not installed: pip install amp_lessons_no_such_library" in support.reason


def test_a_library_that_breaks_on_import_is_installed_but_not_usable(tmp_path, monkeypatch):
    (tmp_path / "amp_broken_library").mkdir()
    (tmp_path / "amp_broken_library" / "__init__.py").write_text(
        "import sys\nsys.stderr.write('noise')\nraise AttributeError(\"module 'torch' has no attribute 'int1'\")\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    support = library_support("amp_broken_library")
    assert not support
    assert "does not import on torch" in support.reason and "int1" in support.reason
    assert "not installed" not in support.reason
    sys.modules.pop("amp_broken_library", None)


def test_a_working_library_gives_its_version(capsys):
    support = library_support("json")
    assert support and support.reason == "" and str(support).startswith("json ")
    torchao = torchao_support()  # either available or a reason, never an exception, never noise on stderr
    assert torchao.available or torchao.reason
    assert capsys.readouterr().err == ""
