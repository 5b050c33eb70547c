"""Objective files as bytes: the encodings YAML 1.2 allows, a clear refusal of any other, and files that are not files."""

from __future__ import annotations

import codecs
import os

import pytest

import rlstab
from rlstab import ConfigError
from rlstab.loading import LIMITS
from rlstab.loading.text import decode, encoding_of

TEXT = "extends: grpo\nname: café ☕\n"


@pytest.mark.parametrize(
    ("encoding", "bom"),
    [
        ("utf-8", b""),
        ("utf-8", codecs.BOM_UTF8),
        ("utf-16-le", codecs.BOM_UTF16_LE),
        ("utf-16-be", codecs.BOM_UTF16_BE),
        ("utf-16-le", b""),  # told apart by the zero byte of 'e' (YAML 1.2, section 5.2)
        ("utf-16-be", b""),
        ("utf-32-le", codecs.BOM_UTF32_LE),
        ("utf-32-be", codecs.BOM_UTF32_BE),
        ("utf-32-le", b""),
        ("utf-32-be", b""),
    ],
)
def test_every_yaml12_encoding_reads_the_same_objective(tmp_path, encoding, bom):
    path = tmp_path / "o.yaml"
    path.write_bytes(bom + TEXT.encode(encoding))
    assert encoding_of(path.read_bytes())[0] == encoding
    assert rlstab.load(path).name == "café ☕"


def test_an_extended_file_in_utf16_is_read_too(tmp_path):
    (tmp_path / "base.yaml").write_bytes(codecs.BOM_UTF16_LE + "extends: dapo\nname: base\n".encode("utf-16-le"))
    (tmp_path / "child.yaml").write_text("extends: base.yaml\nname: child\n")
    assert rlstab.load(tmp_path / "child.yaml").surrogate == rlstab.load("dapo").surrogate


@pytest.mark.parametrize(
    ("data", "where"),
    [
        # 'extends: grpo\n' is line 1; 'name: caf' is columns 1-9 of line 2, so the Latin-1 é is column 10.
        ("extends: grpo\nname: café\n".encode("latin-1"), "line 2, column 10: bytes e9 are not UTF-8 text"),
        (b"\xff\xfe\x00", "bytes 00 are not UTF-16-LE text"),  # a BOM, then half a character
        (b"a: \x80\x81\x82\x83\x84", "line 1, column 4: bytes 80 are not UTF-8 text"),
        (b"extends: grpo\n" + bytes(range(128, 256)), "line 2, column 1: bytes 80 are not UTF-8 text"),
    ],
)
def test_other_bytes_are_refused_with_their_position(tmp_path, data, where):
    path = tmp_path / "bad.yaml"
    path.write_bytes(data)
    with pytest.raises(ConfigError) as info:
        rlstab.load(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    assert where in message, message
    assert "re-save the file as UTF-8" in message
    assert "\n" not in message


def test_decode_is_strict_about_surrogates():
    with pytest.raises(ConfigError, match="line 1, column 4: bytes ed are not UTF-8 text"):
        decode(b"a: \xed\xa0\x80\n", "f")  # an encoded lone surrogate (U+D800) is not UTF-8


def test_a_file_over_the_size_limit_is_refused_before_it_is_read(tmp_path, monkeypatch):
    path = tmp_path / "big.yaml"
    path.write_bytes(b"# " + b"x" * LIMITS.bytes + b"\n")
    opened = []
    monkeypatch.setattr("builtins.open", lambda *a, **k: opened.append(a) or (_ for _ in ()).throw(AssertionError))
    # 2 + 262,144 + 1 bytes
    with pytest.raises(ConfigError, match=r"262,147 bytes; an objective file may have at most 262,144"):
        rlstab.load(path)
    assert opened == []


def test_a_file_at_the_size_limit_is_read(tmp_path):
    text = "aggregation: {kind: token-mean, count: valid}\n"  # no extends: the file has the whole budget
    path = tmp_path / "exact.yaml"
    path.write_text(text + "#" * (LIMITS.bytes - len(text) - 1) + "\n")
    assert path.stat().st_size == LIMITS.bytes
    assert rlstab.load(path).aggregation.count == "valid"


def test_yaml_text_over_the_size_limit_is_refused():
    with pytest.raises(ConfigError, match=r"<yaml text>: 262,145 characters; an objective may have at most 262,144"):
        rlstab.load("extends: grpo\n" + "#" * (LIMITS.bytes + 1 - 15) + "\n")


def test_not_regular_files_are_refused_without_being_opened(tmp_path):
    (tmp_path / "dir.yaml").mkdir()
    os.mkfifo(tmp_path / "pipe.yaml")  # opening it would block until a writer comes
    (tmp_path / "zero.yaml").symlink_to("/dev/zero")  # reading it would never end
    for name in ("dir.yaml", "pipe.yaml", "zero.yaml"):
        with pytest.raises(ConfigError, match=rf"{name}: not a regular file"):
            rlstab.load(tmp_path / name)


def test_unreadable_and_unnamable_files_are_config_errors(tmp_path):
    secret = tmp_path / "secret.yaml"
    secret.write_text("extends: grpo\n")
    secret.chmod(0)
    if os.access(secret, os.R_OK):  # root reads anything: the error cannot be provoked
        secret.chmod(0o644)
    else:
        with pytest.raises(ConfigError, match="cannot read the file: Permission denied"):
            rlstab.load(secret)
    with pytest.raises(ConfigError, match="cannot read the file: File name too long"):
        rlstab.load("x" * 5000 + ".yaml")
    with pytest.raises(ConfigError, match="cannot read the file: embedded null byte"):
        rlstab.load("a\0b.yaml")
    with pytest.raises(ConfigError, match="nor an existing .yaml file"):
        rlstab.load({"extends": "x" * 5000 + ".yaml"})
    with pytest.raises(ConfigError, match="nor an existing .yaml file"):
        rlstab.load({"extends": "a\0b.yaml"})
