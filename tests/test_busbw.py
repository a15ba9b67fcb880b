"""Size strings, the nccl-tests bandwidth arithmetic, and the memory check (host side, no torch)."""

import pytest

from plscale.predict import busbw
from plscale.errors import UserError

K, M, G = 2**10, 2**20, 2**30


@pytest.mark.parametrize("text, size", [("32K", 32 * K), ("64M", 64 * M), ("1G", G), ("4096", 4096),
                                        ("1.5M", 3 * M // 2), ("64MiB", 64 * M), ("8kb", 8 * K), (" 2 G ", 2 * G)])
def test_sizes_parse_as_powers_of_1024(text, size):
    assert busbw.parse_size(text) == size


@pytest.mark.parametrize("text", ["12Q", "", "M", "-5", "0", "1.3", "64 M B x", "0.5K1"])
def test_bad_sizes_raise_a_user_error(text):
    with pytest.raises(UserError, match="Size"):
        busbw.parse_size(text)


def test_ranges_double_like_nccl_tests_and_lists_merge():
    assert busbw.parse_sizes("32K-1M") == [32 * K, 64 * K, 128 * K, 256 * K, 512 * K, M]
    assert busbw.parse_sizes("48K-200K") == [48 * K, 96 * K, 192 * K]
    assert busbw.parse_sizes("1M,32K,1M") == [32 * K, M]
    assert busbw.parse_sizes("4K,32K-64K") == [4 * K, 32 * K, 64 * K]
    assert busbw.parse_sizes(4096) == [4096]  # YAML may hand over a number
    with pytest.raises(UserError, match="backwards"):
        busbw.parse_sizes("64M-32K")


def test_ops_and_dtypes_are_checked():
    assert busbw.parse_ops("all_reduce, all-gather,all_reduce") == ["all_reduce", "all_gather"]
    with pytest.raises(UserError, match="Unknown collective 'allreduce'.*Did you mean: all_reduce"):
        busbw.parse_ops("allreduce")
    with pytest.raises(UserError, match="No collectives"):
        busbw.parse_ops(" , ")
    with pytest.raises(UserError, match="Unknown dtype"):
        busbw.check_dtype("float8")


@pytest.mark.parametrize("n", [2, 3, 4, 8, 64])
def test_bus_factors_follow_nccl_tests(n):
    assert busbw.bus_factor("all_reduce", n) == pytest.approx(2 * (n - 1) / n)
    for op in ("all_gather", "reduce_scatter", "all_to_all"):
        assert busbw.bus_factor(op, n) == pytest.approx((n - 1) / n)
    assert busbw.bus_factor("broadcast", n) == busbw.bus_factor("reduce", n) == 1.0
    assert busbw.bus_factor("all_reduce", n) < 2  # the ring's traffic per rank stays under 2S


def test_algbw_and_busbw_on_known_numbers():
    # 1 GB all-reduced in 0.1 s on 8 ranks: algbw 10 GB/s, busbw 10 * 2 * 7 / 8 = 17.5 GB/s
    assert busbw.bandwidths("all_reduce", 10**9, 0.1, 8) == pytest.approx((10.0, 17.5))
    # nccl-tests' own example: all_gather of 256 MiB on 4 ranks in 4 ms
    algbw, bus = busbw.bandwidths("all_gather", 256 * M, 0.004, 4)
    assert algbw == pytest.approx(67.108864) and bus == pytest.approx(67.108864 * 0.75)
    assert busbw.bandwidths("broadcast", 10**9, 1.0, 4) == pytest.approx((1.0, 1.0))


def test_element_counts_round_down_to_a_multiple_of_the_ranks_for_sharded_ops():
    assert busbw.element_count("all_reduce", 32 * K + 3, "float32", 3) == 8192
    assert busbw.element_count("all_gather", 32 * K, "float32", 3) == 8190
    assert busbw.element_count("all_to_all", 1000, "bfloat16", 4) == 500
    with pytest.raises(UserError, match="no float32 element per rank.*8 B or more"):
        busbw.resolve_sizes("4", ["all_gather"], "float32", 2, "cpu", None)


def test_memory_check_names_a_size_that_fits():
    with pytest.raises(UserError, match=r"Messages of 1G need about 12G .* 4 CPU ranks share 8G.*up to 512M"):
        busbw.check_fits(G, 4, "cpu", 8 * G)
    busbw.check_fits(512 * M, 4, "cpu", 8 * G)      # the size it names fits: 6 GiB of 8
    busbw.check_fits(G, 8, "cuda", 80 * G)           # each GPU has its own memory
    with pytest.raises(UserError, match="each GPU has 16G"):
        busbw.check_fits(8 * G, 8, "cuda", 16 * G)


def test_auto_sizes_start_at_32k_and_stop_at_what_fits():
    assert busbw.resolve_sizes("auto", ["all_reduce"], "float32", 2, "cpu", 64 * G)[-1] == 64 * M
    assert busbw.resolve_sizes("auto", ["all_reduce"], "float32", 8, "cuda", 80 * G)[-1] == G
    small = busbw.resolve_sizes("auto", ["all_reduce"], "float32", 4, "cpu", 1 * G)
    assert small[0] == 32 * K and small[-1] == 32 * M and small[-1] * 3 * 4 <= 0.8 * G


def test_table_has_the_nccl_tests_columns_and_the_ring_ratio():
    row = {"op": "all_reduce", "size": 64 * M, "count": 16 * M, "dtype": "float32", "time_us": 50000.0,
           "algbw": 1.342, "busbw": 1.342, "wrong": 0, "ring_time_us": 60000.0, "ring_busbw": 1.118, "ratio": 1.2}
    lines = busbw.format_table("all_reduce", [row], 2, "gloo")
    assert lines[0] == "# all_reduce on 2 ranks over gloo: busbw = algbw x 1"
    for column in ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "ring/lib"):
        assert column in lines[1]
    assert lines[3].split() == ["67108864", "16777216", "float", "sum", "-1", "50000.0", "1.34", "1.34", "0",
                                "60000.0", "1.12", "1.20x"]
    assert lines[-1] == "# Avg bus bandwidth    : 1.342 GB/s"


def test_csv_round_trips(tmp_path):
    row = {"op": "broadcast", "size": 32768, "count": 8192, "dtype": "float32", "ranks": 2, "backend": "gloo",
           "iters": 20, "time_us": 100.0, "algbw": 0.33, "busbw": 0.33, "wrong": 0}
    busbw.write_csv(tmp_path / "b.csv", [row])
    back = busbw.read_csv(tmp_path / "b.csv")[0]
    assert back["op"] == "broadcast" and back["size"] == 32768 and back["busbw"] == 0.33 and back["ratio"] is None


def test_ring_bytes_sent_per_rank():
    """13 elements on 4 ranks: chunks 4, 3, 3, 3; rank r sends all but chunks r+1 and r+2."""
    from plscale.predict.busbw import bus_factor, ring_bytes_sent
    assert ring_bytes_sent(13, 4, 4) == [(26 - 3 - 3) * 4, (26 - 3 - 3) * 4, (26 - 3 - 4) * 4, (26 - 4 - 3) * 4]
    assert sum(ring_bytes_sent(16, 4, 4)) / 4 == bus_factor("all_reduce", 4) * 16 * 4


@pytest.mark.parametrize("numel, n", [(13, 4), (16, 4), (7, 3), (100, 8), (3, 5)])
def test_ring_schedule_sends_what_ring_bytes_sent_counts(numel, n):
    """2(n-1) steps whose chunks add up to ring_bytes_sent; the naive scheme's rank 0 sends (n-1) S."""
    sizes = [numel // n + (i < numel % n) for i in range(n)]   # torch.tensor_split's chunks
    steps = busbw.ring_schedule(n)
    assert len(steps) == 2 * (n - 1) and [p for p, _, _ in steps].count("reduce-scatter") == n - 1
    sent = [sum(sizes[chunks[r]] for _, _, chunks in steps) * 2 for r in range(n)]
    assert sent == busbw.ring_bytes_sent(numel, 2, n)
    assert busbw.naive_bytes_sent(numel, n) == [(n - 1) * numel] + [numel] * (n - 1)
