"""The gallery scripts' command lines (examples/gallery/*.py): every flag has help with its default,
and a bad flag is refused in one line, before anything is measured.

The scripts' ``main`` is called in-process: parsing comes first in each, and a refusal exits (status
2) before any JAX work, so these tests run in well under a second each.
"""

import importlib
import sys
from pathlib import Path

import pytest

GALLERY = Path(__file__).resolve().parent.parent / "examples" / "gallery"
if str(GALLERY) not in sys.path:
    sys.path.insert(0, str(GALLERY))

SCRIPTS = sorted(p.stem for p in GALLERY.glob("*.py") if not p.name.startswith("_"))
PLOTTING = ["deq_fixed_point", "linear_cross_entropy", "transformer_block"]
# each script's count and size flags, with a value that is not a positive integer
COUNTS = [
    ("straight_through", ["--steps", "-3"], "argument --steps: must be a positive integer, got -3"),
    ("straight_through", ["--bits", "0"], "argument --bits: must be a positive integer, got 0"),
    (
        "straight_through",
        ["--bits", "1"],
        "argument --bits: must be 2 or more (1 bit leaves no grid level but 0), got 1",
    ),
    ("nan_free_gradients", ["--steps", "0"], "argument --steps: must be a positive integer, got 0"),
    ("memory_saving_silu", ["--repeats", "0"], "argument --repeats: must be a positive integer, got 0"),
    ("memory_saving_silu", ["--batch", "-1"], "argument --batch: must be a positive integer, got -1"),
    ("memory_saving_silu", ["--width", "0"], "argument --width: must be a positive integer, got 0"),
    ("memory_saving_silu", ["--layers", "0"], "argument --layers: must be a positive integer, got 0"),
    ("deq_fixed_point", ["--repeats", "0"], "argument --repeats: must be a positive integer, got 0"),
    ("deq_fixed_point", ["--batch", "0"], "argument --batch: must be a positive integer, got 0"),
    ("deq_fixed_point", ["--width", "0"], "argument --width: must be a positive integer, got 0"),
    ("deq_fixed_point", ["--features", "0"], "argument --features: must be a positive integer, got 0"),
    ("deq_fixed_point", ["--iterations", "10", "0"], "argument --iterations: must be a positive integer, got 0"),
    ("deq_fixed_point", ["--plot-iterations", "-5"], "argument --plot-iterations: must be a positive integer, got -5"),
    ("linear_cross_entropy", ["--repeats", "0"], "argument --repeats: must be a positive integer, got 0"),
    ("linear_cross_entropy", ["--tokens", "0"], "argument --tokens: must be a positive integer, got 0"),
    ("linear_cross_entropy", ["--hidden", "0"], "argument --hidden: must be a positive integer, got 0"),
    ("linear_cross_entropy", ["--vocab", "0"], "argument --vocab: must be a positive integer, got 0"),
    ("linear_cross_entropy", ["--chunk", "0"], "argument --chunk: must be a positive integer, got 0"),
    ("linear_cross_entropy", ["--vocab-chunks", "0"], "argument --vocab-chunks: must be a positive integer, got 0"),
    ("linear_cross_entropy", ["--token-chunk", "0"], "argument --token-chunk: must be a positive integer, got 0"),
    ("linear_cross_entropy", ["--plot-vocabs", "0"], "argument --plot-vocabs: must be a positive integer, got 0"),
    ("transformer_block", ["--steps", "-3"], "argument --steps: must be a positive integer, got -3"),
    ("pytorch_ports", ["--steps", "0"], "argument --steps: must be a positive integer, got 0"),
    ("transformer_block", ["--tokens", "0"], "argument --tokens: must be a positive integer, got 0"),
    ("transformer_block", ["--d-model", "0"], "argument --d-model: must be a positive integer, got 0"),
    ("transformer_block", ["--depths", "2", "0"], "argument --depths: must be a positive integer, got 0"),
    ("transformer_block", ["--lr", "0"], "argument --lr: must be a positive number, got 0"),
    ("gradient_clipping", ["--max-norm", "-1"], "argument --max-norm: must be a positive number, got -1"),
    ("straight_through", ["--steps", "many"], "argument --steps: must be a positive integer, like 10, but got 'many'"),
    (
        "linear_cross_entropy",
        ["--tokens", "100", "--chunk", "30"],
        "--tokens 100 must be a multiple of every chunk of it, but 30 does not divide it",
    ),
    (
        "linear_cross_entropy",
        ["--vocab", "1000", "--vocab-chunks", "300"],
        "--vocab 1000 must be a multiple of every chunk of it, but 300 does not divide it",
    ),
]


def _script(name):
    return importlib.import_module(name)


def _refusal(name, argv, capsys):
    """The one line of stderr a refused command line prints (exit status 2)."""
    with pytest.raises(SystemExit) as exited:
        _script(name).main(argv)
    assert exited.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing was measured or printed before the refusal
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    return lines[0]


@pytest.mark.parametrize("name, argv, message", COUNTS, ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_a_bad_count_is_refused_in_one_line(name, argv, message, capsys):
    assert _refusal(name, argv, capsys) == f"{name}.py: error: {message}"


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_flag_has_help_with_its_default(name, capsys):
    with pytest.raises(SystemExit) as exited:
        _script(name).main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    flags = out.split("options:", 1)[1]
    for chunk in flags.split("\n  --")[1:]:  # one option and its help (wrapped lines included)
        flag, _, help_text = chunk.partition(" ")
        assert help_text.strip(), f"{name}: --{flag} has no help"
    for flag, default in {
        "straight_through": [("--steps", "500"), ("--bits", "4")],
        "nan_free_gradients": [("--steps", "200")],
        "memory_saving_silu": [("--repeats", "10")],
        "deq_fixed_point": [("--repeats", "10")],
        "linear_cross_entropy": [("--repeats", "5"), ("--chunk", "1024")],
        "transformer_block": [("--steps", "10"), ("--lr", "0.1")],
        "gradient_clipping": [("--max-norm", "25.0")],
        "gradient_reversal": [("--lambda", "0.5")],
        "pytorch_ports": [("--steps", "30")],
    }[name]:
        help_of_flag = flags.split(f"\n  {flag} ", 1)[1].split("\n  --", 1)[0]
        assert f"(default: {default})" in " ".join(help_of_flag.split()), f"{name}: {flag} {help_of_flag!r}"


@pytest.mark.parametrize("name", PLOTTING)
def test_plot_refuses_a_name_that_is_not_png(name, capsys, tmp_path):
    path = tmp_path / "x.jpg"
    line = _refusal(name, ["--plot", str(path)], capsys)
    assert (
        line
        == f"{name}.py: error: argument --plot: writes a PNG image, so the name must end in .png, but got {str(path)!r}"
    )


@pytest.mark.parametrize("name", PLOTTING)
def test_plot_without_matplotlib_is_refused_before_measuring(name, capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what importlib.util.find_spec reads as "not installed"
    line = _refusal(name, ["--plot", str(tmp_path / "x.png")], capsys)
    assert (
        line == f"{name}.py: error: argument --plot: needs matplotlib, which is not installed: pip install matplotlib"
    )
    assert "jaxfn[examples]" not in line


@pytest.mark.parametrize("name", PLOTTING)
def test_plot_refuses_a_missing_folder(name, capsys, tmp_path):
    path = tmp_path / "no such folder" / "x.png"
    line = _refusal(name, ["--plot", str(path)], capsys)
    assert line.endswith(f"argument --plot: the folder {path.parent} does not exist, so {str(path)!r} can't be written")
