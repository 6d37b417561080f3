import numpy as np
import pandas as pd
import pytest

from rankscope.lineprotocol import (
    LineProtocolError,
    encode_frame,
    encode_lines,
    encode_prefixes,
    quote_string,
)


def test_escaping_rules():
    tags = pd.DataFrame({"job": ["a b,c=d"], "rank": [3]})
    prefix = encode_prefixes("my m,x", tags)
    assert prefix.tolist() == [r"my\ m\,x,job=a\ b\,c\=d,rank=3"]
    lines = encode_lines(prefix, {"f k": np.array([1.5]), "n": np.array([7]),
                                  "s": np.array(['say "hi" \\ bye'], dtype=object)}, 42)
    assert lines == [r'my\ m\,x,job=a\ b\,c\=d,rank=3 f\ k=1.500,n=7i,s="say \"hi\" \\ bye" 42']


def test_floats_are_shortest_round_trip():
    vals = np.array([0.1, 1 / 3, 1e-300, 123456789.123456789])
    lines = encode_lines(np.array(["m"] * 4, dtype=object), {"v": vals}, np.arange(4))
    back = [float(line.split("v=")[1].split(" ")[0]) for line in lines]
    assert back == vals.tolist()


def test_missing_values_are_left_out():
    df = pd.DataFrame({"time": [1, 2], "job": ["j", "j"], "a": [1.0, np.nan], "b": [np.nan, 2.0]})
    assert encode_frame("m", df, ["job"], ["a", "b"]) == ["m,job=j a=1.000 1", "m,job=j b=2.000 2"]


@pytest.mark.parametrize("bad", ["two\nlines", "cr\r", "ends\\", "slash\\,comma", "slash\\ space"])
def test_uncarriable_tag_values_refused(bad):
    with pytest.raises(LineProtocolError, match="line protocol cannot carry"):
        encode_prefixes("m", pd.DataFrame({"job": [bad]}))


def test_influxql_string_quoting():
    assert quote_string("it's") == r"'it\'s'"
    assert quote_string("a\\b") == r"'a\\b'"
    with pytest.raises(LineProtocolError):
        quote_string("x\ny")


def test_prefix_cache_follows_changed_tags_and_repeated_ranks():
    """Cached prefixes are never stale: a rank whose tags change gets new ones, and a frame
    with several rows per rank (one per stage) is encoded row by row."""
    import pandas as pd

    from rankscope.lineprotocol import encode_prefixes
    from rankscope.store.prefix_cache import PrefixCache

    cache = PrefixCache()
    first = pd.DataFrame({"job": "j", "rank": [3, 1, 2], "host": ["a", "b", "c"]})
    assert cache.prefixes("m", first).tolist() == encode_prefixes("m", first).tolist()
    moved = pd.DataFrame({"job": "j", "rank": [1, 3], "host": ["b", "z"]})   # rank 3 moved host
    assert cache.prefixes("m", moved).tolist() == ["m,host=b,job=j,rank=1", "m,host=z,job=j,rank=3"]
    per_stage = pd.DataFrame({"job": "j", "rank": [5, 5], "stage": ["mlp", "dispatch"]})
    assert cache.prefixes("m", per_stage).tolist() == ["m,job=j,rank=5,stage=mlp",
                                                        "m,job=j,rank=5,stage=dispatch"]
