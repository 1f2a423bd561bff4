"""The support-size figure's log axis follows the data (range and ticks), and its hover names the
median and the interval's ends."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from app import charts


def frame(medians, lows, highs) -> pd.DataFrame:
    return pd.DataFrame({"layer": list(range(len(medians))), "median": medians, "ci_low": lows, "ci_high": highs})


def visible(fig) -> tuple[float, float]:
    low, high = fig.layout.yaxis.range
    return 10**low, 10**high


@pytest.mark.parametrize(
    ("low", "high"),
    [(14, 19), (1, 3000), (0.5, 1.2), (8, 41), (16, 16), (100, 101), (2, 60), (1, 1e9), (5000, 5003)],
)
def test_the_log_axis_has_at_least_three_labelled_ticks_inside_whatever_the_range(low, high):
    fig = charts.support_figure(frame([low, high], [low, high], [low, high]), 0.9)
    bottom, top = visible(fig)
    ticks = list(fig.layout.yaxis.tickvals)
    assert fig.layout.yaxis.type == "log"
    assert bottom < low and top > high  # the data is inside, padded
    inside = [t for t in ticks if bottom <= t <= top]
    assert len(inside) >= 3 and inside == ticks, (ticks, bottom, top)
    assert len(fig.layout.yaxis.ticktext) == len(ticks) and all(fig.layout.yaxis.ticktext)
    assert ticks == sorted(set(ticks)) and len(ticks) <= 12


def test_a_narrow_range_is_padded_so_that_one_token_does_not_fill_the_height():
    fig = charts.support_figure(frame([15.0, 17.0, 16.0], [14.0, 15.0, 15.0], [16.0, 19.0, 17.0]), 0.9)
    bottom, top = visible(fig)
    assert top / bottom >= 3 - 1e-9  # a factor of 3 at least: 14..19 is a factor of 1.36
    assert bottom < 14 and top > 19
    one_token = math.log10(16 / 15) / math.log10(top / bottom)
    assert one_token < 0.1  # 15 -> 16 is under a tenth of the axis's height
    assert list(fig.layout.yaxis.tickvals) == [10, 15, 20, 25]
    assert list(fig.layout.yaxis.ticktext) == ["10", "15", "20", "25"]


def test_decade_ranges_keep_1_2_5_ticks_and_many_decades_only_powers_of_ten():
    _, ticks = charts.log_axis(1, 3000)
    assert ticks == [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000]
    _, ticks = charts.log_axis(1, 1e30)
    assert all(math.log10(t) == round(math.log10(t)) for t in ticks) and 3 <= len(ticks) <= 12
    span, ticks = charts.log_axis(0.5, 1.2)
    assert ticks == [0.6, 0.8, 1.0, 1.2] and 10 ** span[0] < 0.5 and 10 ** span[1] > 1.2
    fig = charts.support_figure(frame([0.6, 1.0], [0.5, 0.8], [0.7, 1.2]), 0.9)
    assert list(fig.layout.yaxis.ticktext) == ["0.6", "0.8", "1", "1.2"]
    thousands = charts.support_figure(frame([1500.0, 2500.0], [1200.0, 2000.0], [1800.0, 3000.0]), 0.9)
    assert "2,000" in thousands.layout.yaxis.ticktext


def test_the_hover_names_the_median_and_the_intervals_ends():
    fig = charts.support_figure(frame([17.0, 10.5], [14.0, 8.0], [19.0, 12.25]), 0.9)
    trace = fig.data[0]
    assert [list(c) for c in trace.customdata] == [["17", "14", "19"], ["10.5", "8", "12.25"]]
    template = trace.hovertemplate
    assert "median %{customdata[0]}, 95% interval [%{customdata[1]}, %{customdata[2]}]" in template
    filled = template.replace("%{x}", "0")
    for i, value in enumerate(trace.customdata[0]):
        filled = filled.replace(f"%{{customdata[{i}]}}", value)
    assert filled.startswith("layer 0<br>median 17, 95% interval [14, 19]")
    # the error bars still reach the interval's ends
    assert list(trace.error_y.array) == [2.0, 1.75] and list(trace.error_y.arrayminus) == [3.0, 2.5]


def test_a_frame_without_positive_sizes_still_gets_an_axis():
    fig = charts.support_figure(frame([], [], []), 0.9)
    assert len(fig.layout.yaxis.tickvals) >= 3
    zeros = charts.support_figure(frame([0.0], [0.0], [0.0]), 0.9)
    assert len(zeros.layout.yaxis.tickvals) >= 3


def test_a_local_layers_window_bounds_its_support_on_the_chart():
    frame = pd.DataFrame({"layer": [0, 1, 2], "median": [10.0, 40.0, 300.0], "ci_low": [8.0, 20.0, 200.0],
                          "ci_high": [15.0, 41.0, 900.0]})  # fmt: skip
    fig = charts.support_figure(frame, 0.9, windows=[64, 64, None])
    window = next(t for t in fig.data if t.name == "a local layer's window")
    assert list(window.y) == [64, 64, None, 64, 64, None]  # over layers 0 and 1, at the window
    assert list(fig.layout.xaxis.ticktext) == ["0 L", "1 L", "2 G"]
    assert len(charts.support_figure(frame, 0.9).data) == 1  # a model without local layers: no line
