"""The result store: complete points appear atomically; failures keep their logs apart and are retried."""

from __future__ import annotations

import pandas as pd
import pytest

from servescope.store import Store


def test_complete_point_roundtrip(tmp_path):
    st = Store(tmp_path)
    key = st.key({"a": 1})
    assert key == st.key({"a": 1}) and key != st.key({"a": 2})
    with st.writing(key, {"a": 1}) as w:
        w.put_table("summary", pd.DataFrame({"x": [1, 2]}))
        assert not st.has(key)  # invisible until complete
    assert st.has(key)
    pt = st.get(key)
    assert pt.manifest["status"] == "complete" and pt.manifest["parts"] == {"a": 1}
    assert pt.table("summary")["x"].tolist() == [1, 2]
    assert pt.table("absent").empty
    assert not any(p.name.startswith(".tmp") for p in tmp_path.iterdir())


def test_failed_point_goes_to_failed_and_keeps_tables(tmp_path):
    st = Store(tmp_path)
    key = st.key({"b": 1})
    with pytest.raises(RuntimeError):
        with st.writing(key, {"b": 1}) as w:
            w.put_table("requests", pd.DataFrame({"y": [3]}))
            raise RuntimeError("server died")
    assert not st.has(key)
    (failed,) = st.failed_attempts(key)
    assert pd.read_parquet(failed / "requests.parquet")["y"].tolist() == [3]
    assert "server died" in (failed / "manifest.json").read_text()
