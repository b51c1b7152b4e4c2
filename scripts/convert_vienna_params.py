"""Writes layers/data/rna_turner2004.json from ViennaRNA's default (Turner 2004) parameter set, and
the other sets foldax ships as ViennaRNA ``.par`` files (``--par``).

Run once, with the `viennarna` Python package installed (a test extra):

    .venv/bin/python scripts/convert_vienna_params.py            # writes the packaged data file
    .venv/bin/python scripts/convert_vienna_params.py --check    # compares it with a fresh conversion
    .venv/bin/python scripts/convert_vienna_params.py --par langdon2018 [--check]   # rna_langdon2018.par

ViennaRNA writes its current parameter set with ``RNA.params_save`` (the ``.par`` format); this
script parses that file with foldax's own reader (``foldax.layers.energy_params``), starting from an
all-NaN table so that any entry the file leaves unset shows up, and stores the result in foldax's
layout (tokens ACGUN, pair types CG GC GU UG AU UA) as integers in dcal/mol (ViennaRNA's unit;
``null`` = INF), with its enthalpies (for other temperatures), provenance and citations. foldax reads
it at run time without ViennaRNA.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import sys
import tempfile

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from foldax.layers import energy_params as ep  # noqa: E402  (after the sys.path line)

OUT = pathlib.Path(__file__).resolve().parents[1] / "layers" / "data" / "rna_turner2004.json"

CITATIONS = [
    "Turner DH, Mathews DH (2010) NNDB: the nearest neighbor parameter database for predicting "
    "stability of nucleic acid secondary structure. Nucleic Acids Res 38:D280-D282.",
    "Mathews DH, Disney MD, Childs JL, Schroeder SJ, Zuker M, Turner DH (2004) Incorporating "
    "chemical modification constraints into a dynamic programming algorithm for prediction of RNA "
    "secondary structure. Proc Natl Acad Sci USA 101:7287-7292.",
    "Lorenz R, Bernhart SH, Hoener zu Siederdissen C, Tafer H, Flamm C, Stadler PF, Hofacker IL "
    "(2011) ViennaRNA Package 2.0. Algorithms Mol Biol 6:26.",
]


def saved_text(loader: str) -> str:
    """The ``.par`` text ``RNA.params_save`` writes after ``RNA.<loader>()``; ViennaRNA is left holding
    Turner 2004, its default (its parameters are global)."""
    import RNA

    getattr(RNA, loader)()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = pathlib.Path(tmp) / "saved.par"
            if not RNA.params_save(str(path)):
                raise RuntimeError("RNA.params_save failed")
            return path.read_text()
    finally:
        RNA.params_load_RNA_Turner2004()


def convert() -> dict:
    import RNA

    text = saved_text("params_load_RNA_Turner2004")
    raw, enthalpies = _nan_raw(), _nan_raw()
    ep._parse_into(raw, text, "rna_turner2004.par (RNA.params_save)", enthalpies)
    tables, scalars, special = _json_tables(raw, ep.SCALAR_NAMES)
    if scalars["lxc"] != 107.856:  # the file's Misc line carries lxc as ViennaRNA's lxc37
        raise RuntimeError(f"unexpected lxc {scalars['lxc']}")
    heat_tables, heat_scalars, heat_special = _json_tables(enthalpies, ep._SCALAR_ENTHALPIES)
    if set(heat_special) != set(special):
        raise RuntimeError("the special hairpins' energies and enthalpies name different loops")
    return {
        "format": "foldax-energy-params-1",
        "name": "RNA - Turner 2004",
        "units": "dcal/mol (10 cal/mol) at 37 C; integers; null = INF (forbidden); divide by 100 for kcal/mol",
        "layout": {
            "bases": "ACGUN (foldax tokens; N = ViennaRNA's base 0, also any IUPAC code)",
            "pair_types": list(ep.PAIR_TYPES),
            "doc": "see layers/energy_params.py for the index meaning of each table",
        },
        "provenance": {
            "source": "ViennaRNA default parameter set (RNA.params_load_RNA_Turner2004, written by RNA.params_save)",
            "viennarna_version": RNA.__version__,
            "converted_by": "scripts/convert_vienna_params.py",
            "date": datetime.date.today().isoformat(),
            "citations": CITATIONS,
        },
        "tables": tables,
        "scalars": scalars,
        "special_hairpins": special,
        "enthalpies": {
            "units": "dcal/mol; the same layout; G(T) = H - (H - G37) (T + 273.15) / 310.15 (max_ninio has none)",
            "tables": heat_tables,
            "scalars": heat_scalars,
            "special_hairpins": heat_special,
        },
    }


def _json_tables(raw: dict, scalar_names) -> tuple[dict, dict, dict]:
    """A parsed ViennaRNA-layout set in the JSON's layout; every entry must be set."""
    tables = {}
    for key in ep.TABLE_SHAPES:
        table = raw[key][ep._vienna_index(key)] if key in ep._AXES else raw[key]
        if np.isnan(table).any():
            raise RuntimeError(f"{key}: the saved file left entries unset")
        tables[key] = _to_json(table)
    scalars = {}
    for key in scalar_names:
        if np.isnan(raw[key]):
            raise RuntimeError(f"{key}: the saved file left it unset")
        scalars[key] = raw[key] if key == "lxc" else int(raw[key])
    return tables, scalars, {seq: int(e) for seq, e in raw["special_hairpins"].items()}


#: ``--par`` sets: ViennaRNA loader, citation, and the data they were fit to (which overlaps ArchiveII).
PAR_SETS = {
    "andronescu2007": ("params_load_RNA_Andronescu2007",
                       "Andronescu M, Condon A, Hoos HH, Mathews DH, Murphy KP (2007) Efficient parameter estimation "
                       "for RNA secondary structure prediction. Bioinformatics 23:i19-i28.",
                       "fit to known secondary structures (RNA STRAND's sources: tRNA, 5S/16S/23S rRNA, SRP, "
                       "RNase P, ... -- the sources of ArchiveII too) and optical melting data"),
    "langdon2018": ("params_load_RNA_Langdon2018",
                    "Langdon WB, Petke J, Lorenz R (2018) Evolving better RNAfold structure prediction. "
                    "EuroGP 2018, LNCS 10781:220-236.",
                    "evolved by genetic programming on 4,655 known secondary structures from RNA STRAND (whose "
                    "sources are ArchiveII's too)"),
    "turner1999": ("params_load_RNA_Turner1999",
                   "Mathews DH, Sabina J, Zuker M, Turner DH (1999) Expanded sequence dependence of thermodynamic "
                   "parameters improves prediction of RNA secondary structure. J Mol Biol 288:911-940.",
                   "optical melting experiments (the nearest-neighbour set Turner 2004 revised); its multiloop "
                   "terms were chosen for prediction accuracy on known structures, as Turner 2004's were"),
}


def par_text(name: str) -> str:
    """ViennaRNA's parameter set ``name`` (:data:`PAR_SETS`) as ``RNA.params_save`` writes it, with a
    provenance comment under the first line; ViennaRNA is left holding Turner 2004."""
    import RNA

    loader, citation, data = PAR_SETS[name]
    first, rest = saved_text(loader).split("\n", 1)
    about = [f"source: ViennaRNA {RNA.__version__}, RNA.{loader}, written by RNA.params_save "
             f"(scripts/convert_vienna_params.py --par {name})", f"citation: {citation}", f"data: {data}"]
    return first + "\n" + "".join(f"/* {line} */\n" for line in about) + rest


def _without_source(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.startswith("/* source: ")]


def _nan_raw() -> dict:
    raw = {key: np.full(ep._raw_shape(key), np.nan) for key in ep._AXES}
    for key in ("hairpin", "bulge", "interior"):
        raw[key] = np.full(ep.MAX_LOOP + 1, np.nan)
    for key in ep.SCALAR_NAMES:
        raw[key] = np.nan
    raw["special_hairpins"] = {}
    return raw


def _to_json(table: np.ndarray):
    table = np.asarray(table)
    if table.ndim == 0:
        value = float(table)
        if value == np.inf:
            return None
        if value != int(value):
            raise RuntimeError(f"non-integer energy {value}")
        return int(value)
    return [_to_json(t) for t in table]


def dumps(data: dict) -> str:
    """JSON with one innermost row per line (readable diffs, ~0.3 MB)."""
    text = json.dumps(data, indent=1)
    # collapse innermost lists of numbers onto one line
    import re

    return re.sub(r"\[\s+([-\d, \snul]+?)\s+\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", text) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare the packaged file with a fresh conversion")
    parser.add_argument("--out", type=pathlib.Path, default=OUT)
    parser.add_argument("--par", choices=sorted(PAR_SETS), help="write (or --check) layers/data/rna_NAME.par instead")
    args = parser.parse_args(argv)
    if args.par:
        out = OUT.parent / f"rna_{args.par}.par"
        text = par_text(args.par)
        if args.check:  # all but the source line, which names the ViennaRNA version
            same = _without_source(out.read_text()) == _without_source(text)
            print(f"{out}: {'identical to' if same else 'DIFFERS from'} a fresh RNA.params_save")
            return 0 if same else 1
        out.write_text(text)
        print(f"wrote {out} ({out.stat().st_size / 1e3:.0f} kB)")
        return 0
    data = convert()
    if args.check:
        packaged = json.loads(args.out.read_text())
        same = all(packaged.get(k) == data[k] for k in ("tables", "scalars", "special_hairpins", "enthalpies"))
        print(
            f"{args.out}: {'identical to' if same else 'DIFFERS from'} ViennaRNA {data['provenance']['viennarna_version']}"
        )
        return 0 if same else 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(dumps(data))
    print(
        f"wrote {args.out} ({args.out.stat().st_size / 1e3:.0f} kB) from ViennaRNA {data['provenance']['viennarna_version']}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
