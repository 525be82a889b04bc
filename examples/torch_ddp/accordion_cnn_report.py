# SPDX-License-Identifier: Apache-2.0
"""results.json, results.md and the SVG plots of accordion_cnn.py's runs (OUT/runs/*.json).

The verdict follows the C++ demo's (examples/fmnist/report.hpp): Accordion's mean final test
accuracy within the seed spread (at least 0.5 points) of static low's, with at most 60% of static
low's floats."""
import glob
import html
import json
import math
import os

# The runs, in the order the table and the plots show them (accordion_cnn.py trains them so).
RUNS = ("allreduce", "torch-powersgd-low", "torch-powersgd-high", "powersgd-low", "powersgd-high",
        "powersgd-accordion-keep", "powersgd-accordion-reset", "topk-low", "topk-high", "topk-accordion")
TOLERANCE = 0.005  # accuracy tolerance when the seeds spread less than this
FLOATS_TARGET = 0.60
PAIRS = (  # (family label, static low, static high, Accordion) of each verdict
    ("PowerSGD, level change keep", "powersgd-low", "powersgd-high", "powersgd-accordion-keep"),
    ("PowerSGD, level change reset", "powersgd-low", "powersgd-high", "powersgd-accordion-reset"),
    ("top-k", "topk-low", "topk-high", "topk-accordion"),
)
COLOURS = {"uncompressed": "#000000", "torch-powersgd": "#9467bd", "powersgd": "#1f77b4", "topk": "#d62728"}
DASHES = {"none": "", "static low": "6,3", "static high": "2,3", "accordion": "", "accordion reset": "10,3,2,3"}


def milestones(settings):
    return [settings["epochs"] // 2, (3 * settings["epochs"]) // 4]


def forced_low(settings, epoch):
    """Whether Accordion's rule runs every layer low in `epoch` whatever the norms say: up to its
    second check, and from a learning-rate decay to the next check."""
    if epoch == 0:
        return True
    last_check = (epoch - 1) // settings["interval"] * settings["interval"]
    return last_check == 0 or any(last_check < m <= epoch for m in milestones(settings))


class Summary:
    """One run over its seeds."""

    def __init__(self, runs):
        self.runs = runs
        first = runs[0]
        self.key, self.label, self.method, self.policy = first["run"], first["label"], first["method"], first["policy"]
        finals = [r["epochs"][-1]["test_accuracy"] for r in runs]
        self.accuracy = sum(finals) / len(finals)
        self.spread = max(finals) - min(finals)
        self.floats = sum(r["epochs"][-1]["floats"] for r in runs) / len(runs)
        self.seconds = sum(r["seconds"] for r in runs) / len(runs)
        epochs = len(first["epochs"])
        self.curve = [sum(r["epochs"][e]["test_accuracy"] for r in runs) / len(runs) for e in range(epochs)]
        self.cumulative = [sum(r["epochs"][e]["floats"] for r in runs) / len(runs) for e in range(epochs)]
        self.epoch_floats = [c - (self.cumulative[e - 1] if e else 0) for e, c in enumerate(self.cumulative)]

    def high_share(self, sizes):
        """The share of the compressed layers' elements x epochs run at the high level."""
        high = total = 0
        for r in self.runs:
            for e in r["epochs"]:
                for size, level in zip(sizes, e["levels"]):
                    if level != "dense":
                        total += size
                        high += size if level == "high" else 0
        return high / total if total else 0.0

    def drops(self):
        """The deepest fall of test accuracy after a switch to the high level, per seed: over the
        epochs e in which a layer runs high that ran low in e - 1, the accuracy after e - 1 minus
        the lowest after e and e + 1."""
        out = []
        for r in self.runs:
            deepest, ep = 0.0, r["epochs"]
            for e in range(1, len(ep)):
                if any(b == "low" and a == "high" for b, a in zip(ep[e - 1]["levels"], ep[e]["levels"])):
                    lowest = min(x["test_accuracy"] for x in ep[e:e + 2])
                    deepest = max(deepest, ep[e - 1]["test_accuracy"] - lowest)
            out.append(deepest)
        return out


def write(out, settings, layers, labels):
    """Reads OUT/runs and writes OUT/results.json, OUT/results.md and OUT/*.svg; layers:
    [(name, shape)] of the model; labels: {run: label} as accordion_cnn.py names the runs now."""
    found = []
    for path in sorted(glob.glob(os.path.join(out, "runs", "*.seed*.json"))):
        with open(path) as f:
            found.append(json.load(f))
    if not found:
        print(f"accordion_cnn: no runs in {out}/runs, no report")
        return
    by_key = {}
    for r in sorted(found, key=lambda r: (RUNS.index(r["run"]) if r["run"] in RUNS else len(RUNS), r["seed"])):
        r["label"] = labels.get(r["run"], r["label"])
        by_key.setdefault(r["run"], []).append(r)
    sums = {k: Summary(v) for k, v in by_key.items()}
    sizes = [math.prod(shape) for _, shape in layers]
    forced = [e for e in range(settings["epochs"]) if forced_low(settings, e)]
    config = dict(settings, milestones=milestones(settings), forced_low_epochs=forced,
                  floor=len(forced) / settings["epochs"], seeds=sorted({r["seed"] for r in found}))
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(dict(config=config, layers=[dict(name=n, shape=s) for n, s in layers],
                       runs=[r for k in by_key for r in by_key[k]]), f, indent=None, separators=(",", ":"))
    md = report(settings, config, sums, sizes, forced)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(md)
    plots(out, settings, sums, by_key, layers)
    print(f"accordion_cnn: wrote {out}/results.json, results.md and 4 plots")


def report(settings, config, sums, sizes, forced):
    s = settings
    base = sums.get("allreduce")
    lines = ["# Accordion on a residual CNN through bellows_torch", "",
             f"The first {s['train_images']} Fashion-MNIST training images, scaled to {s['image_size']}x{s['image_size']} "
             f"(area), a fresh shuffle each epoch; test accuracy on {s['test_images']} test images. ResNet-8 of widths "
             f"{s['width']}, {2 * s['width']}, {4 * s['width']} with batch norm ({sum(sizes):,} parameters in "
             f"{len(sizes)} tensors; PowerSGD sees a convolution as an (out, in*k*k) matrix). {s['workers']} gloo "
             f"processes x batch {s['batch']}, 1 thread each; SGD lr {s['lr']} momentum 0.9 weight decay "
             f"{s['weight_decay']}; {s['epochs']} epochs, x0.1 from epochs {config['milestones'][0]} and "
             f"{config['milestones'][1]} (numbered from 0); Accordion checks every {s['interval']} epoch(s), eta "
             f"{s['eta']}; seeds {', '.join(map(str, config['seeds']))}. PyTorch's hook: start_powerSGD_iter = 2, "
             f"so its first two steps of each run are plain allreduces (counted in its floats).", "",
             f"The floor: the schedule forces every layer low in epochs {', '.join(map(str, forced))} of "
             f"{s['epochs']}, whatever the norms say, which spends {100 * config['floor']:.0f}% of static low's floats "
             f"(at most 45% was asked). Accordion's floats can go no lower than that share at the low level plus "
             f"static high's floats in the other epochs: the \"lowest possible\" of each verdict.", "",
             "| run | final test accuracy (mean) | spread | floats sent per worker | vs allreduce | vs static low "
             "| epochs at high level | deepest drop after a switch | wall time per run |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    lows = {"torch-powersgd": "torch-powersgd-low", "powersgd": "powersgd-low", "topk": "topk-low"}
    for key, r in sums.items():
        low = sums.get(lows.get(r.method, ""), None)
        vs_low = f"{100 * r.floats / low.floats:.1f}%" if low else "-"
        vs_base = f"{100 * r.floats / base.floats:.2f}%" if base else "-"
        drops = r.drops()
        drop = (f"{100 * sum(drops) / len(drops):.2f} (worst {100 * max(drops):.2f})"
                if r.policy.startswith("accordion") else "-")
        high = f"{100 * r.high_share(sizes):.0f}%" if r.policy.startswith("accordion") else "-"
        lines.append(f"| {r.label} | {100 * r.accuracy:.2f}% | {100 * r.spread:.2f} | {r.floats:.3g} | {vs_base} | "
                     f"{vs_low} | {high} | {drop} | {r.seconds:.0f} s |")
    lines += ["", "Accuracy and spread in points, over the seeds. \"Epochs at high level\": the share of the "
              "compressed layers' elements x epochs run at the high level. \"Deepest drop after a switch\": test "
              "accuracy after the epoch before a layer switched from low to high minus the lowest of the next two "
              "epochs' (mean over seeds, and the worst seed).", "", "## Verdict", "",
              "The claim: Accordion's final accuracy within the seed spread (at least 0.5 points) of static low's, "
              f"with at most {100 * FLOATS_TARGET:.0f}% of static low's floats.", ""]
    for family, lo, hi, acc in PAIRS:
        if not all(k in sums for k in (lo, hi, acc)):
            continue
        L, H, A = sums[lo], sums[hi], sums[acc]
        gap = A.accuracy - L.accuracy
        tol = max(L.spread, A.spread, TOLERANCE)
        ratio = A.floats / L.floats
        lowest = sum((L if e in forced else H).epoch_floats[e] for e in range(len(L.epoch_floats))) / L.floats
        acc_ok, floats_ok = gap >= -tol - 1e-9, ratio <= FLOATS_TARGET
        text = (f"- **{A.label}** ({family}): the claim {'HOLDS' if acc_ok and floats_ok else 'does NOT hold'}. "
                f"Accordion {100 * A.accuracy:.2f}% vs static low {100 * L.accuracy:.2f}% ({100 * gap:+.2f} points, "
                f"tolerance {100 * tol:.2f}), with {100 * ratio:.1f}% of static low's floats (target <= "
                f"{100 * FLOATS_TARGET:.0f}%; the lowest possible {100 * lowest:.1f}%)")
        if not acc_ok:
            text += "; accuracy outside the tolerance"
        if not floats_ok:
            text += "; too many floats"
        high_gap = H.accuracy - L.accuracy
        text += (f". Static high: {100 * H.accuracy:.2f}% ({100 * high_gap:+.2f} points) with "
                 f"{100 * H.floats / L.floats:.0f}% of static low's floats")
        if high_gap >= -tol - 1e-9:
            text += ", also within the tolerance: on this task the high level alone loses no accuracy"
        lines.append(text + ".")
    torch_rows = [(k, "torch-" + k) for k in ("powersgd-low", "powersgd-high")
                  if k in sums and "torch-" + k in sums]
    if torch_rows:
        lines += ["", "bellows' PowerSGD beside PyTorch's hook at the same rank (final accuracy, floats per worker):", ""]
        for k, t in torch_rows:
            lines.append(f"- {sums[k].label}: {100 * sums[k].accuracy:.2f}% with {sums[k].floats:.3g} floats; "
                         f"{sums[t].label}: {100 * sums[t].accuracy:.2f}% with {sums[t].floats:.3g}.")
    lines += ["", "## Where Accordion's accuracy goes", "",
              "Per epoch, mean over the seeds: the compressed layers at the high level during the epoch "
              "(of both seeds), and the test accuracy after it beside static low's.", ""]
    for family, lo, _, acc in PAIRS:
        if lo not in sums or acc not in sums:
            continue
        L, A = sums[lo], sums[acc]
        lines += [f"{A.label}:", "", "| epoch | lr | layers high | Accordion | static low | gap |", "|---:|---:|---:|---:|---:|---:|"]
        for e in range(len(A.curve)):
            high = sum(lv == "high" for r in A.runs for lv in r["epochs"][e]["levels"])
            comp = sum(lv != "dense" for r in A.runs for lv in r["epochs"][e]["levels"])
            lr = A.runs[0]["epochs"][e]["lr"]
            lines.append(f"| {e} | {lr:g} | {high}/{comp} | {100 * A.curve[e]:.2f}% | {100 * L.curve[e]:.2f}% | "
                         f"{100 * (A.curve[e] - L.curve[e]):+.2f} |")
        lines.append("")
    lines += ["## Plots", "", "![test accuracy per epoch](accuracy.svg)", "",
              "Test accuracy after every epoch, mean over the seeds: a colour per family, solid for Accordion "
              "(dash-dot for reset), dashed for static low, dotted for static high; grey lines mark the decays.", "",
              "![cumulative floats](floats.svg)", "", "Floats one worker has sent since the start (log scale).", "",
              "![levels](levels.svg)", "",
              "Each Accordion run's levels per layer (rows, in the model's order) and epoch (columns), per seed: "
              "blue low, orange high, grey uncompressed.", "", "![norm change](norms.svg)", "",
              f"Each compressed layer's relative change of its mean-gradient norm at each check, "
              f"|n_e - n_(e-1)| / n_(e-1), seed {sums[PAIRS[0][3]].runs[0]['seed'] if PAIRS[0][3] in sums else 1}, "
              f"beside eta = {s['eta']} (black): a layer whose change falls below eta runs high in the next epoch, "
              "unless a decay comes first.", ""]
    return "\n".join(lines)


class Svg:
    """A line plot: x and y axes with ticks, optional log y."""

    def __init__(self, title, xlabel, ylabel, x_range, y_range, log_y=False, w=820, h=360):
        self.w, self.h, self.log = w, h, log_y
        self.left, self.right, self.top, self.bottom = 60, w - 300, 30, h - 45
        self.x0, self.x1 = x_range
        self.y0, self.y1 = (math.log10(y_range[0]), math.log10(y_range[1])) if log_y else y_range
        self.parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" '
                      f'font-size="11"><rect width="{w}" height="{h}" fill="white"/>',
                      f'<text x="{w / 2}" y="16" text-anchor="middle" font-size="13">{html.escape(title)}</text>',
                      f'<text x="{(self.left + self.right) / 2}" y="{h - 8}" text-anchor="middle">{xlabel}</text>',
                      f'<text x="14" y="{(self.top + self.bottom) / 2}" text-anchor="middle" '
                      f'transform="rotate(-90 14 {(self.top + self.bottom) / 2})">{ylabel}</text>']
        self.legend = 0
        self.axes()

    def px(self, x):
        return self.left + (x - self.x0) / (self.x1 - self.x0) * (self.right - self.left)

    def py(self, y):
        v = math.log10(max(y, 1e-30)) if self.log else y
        return self.bottom - (v - self.y0) / (self.y1 - self.y0) * (self.bottom - self.top)

    def axes(self):
        p = self.parts
        p.append(f'<rect x="{self.left}" y="{self.top}" width="{self.right - self.left}" '
                 f'height="{self.bottom - self.top}" fill="none" stroke="#444"/>')
        for x in range(int(self.x0), int(self.x1) + 1, max(1, int(self.x1 - self.x0) // 8)):
            p.append(f'<text x="{self.px(x):.1f}" y="{self.bottom + 14}" text-anchor="middle">{x}</text>')
        if self.log:
            ticks = [10 ** k for k in range(math.ceil(self.y0), math.floor(self.y1) + 1)]
        else:
            step = (self.y1 - self.y0) / 5
            ticks = [self.y0 + i * step for i in range(6)]
        for y in ticks:
            yy = self.py(y)
            label = f"{y:.0e}" if self.log else f"{y:.3g}"
            p.append(f'<line x1="{self.left}" x2="{self.right}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#eee"/>')
            p.append(f'<text x="{self.left - 4}" y="{yy + 4:.1f}" text-anchor="end">{label}</text>')

    def vline(self, x, colour="#bbb"):
        self.parts.append(f'<line x1="{self.px(x):.1f}" x2="{self.px(x):.1f}" y1="{self.top}" y2="{self.bottom}" '
                          f'stroke="{colour}"/>')

    def line(self, xs, ys, colour, dash="", label=None, width=1.5):
        pts = " ".join(f"{self.px(x):.1f},{self.py(y):.1f}" for x, y in zip(xs, ys) if y is not None)
        self.parts.append(f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="{width}" '
                          f'stroke-dasharray="{dash}"/>')
        if label:
            y = self.top + 6 + 14 * self.legend
            self.legend += 1
            self.parts.append(f'<line x1="{self.right + 8}" x2="{self.right + 30}" y1="{y}" y2="{y}" stroke="{colour}" '
                              f'stroke-width="{width}" stroke-dasharray="{dash}"/>')
            self.parts.append(f'<text x="{self.right + 34}" y="{y + 4}">{html.escape(label)}</text>')

    def save(self, path):
        with open(path, "w") as f:
            f.write("\n".join(self.parts + ["</svg>\n"]))


def plots(out, settings, sums, by_key, layers):
    epochs = settings["epochs"]
    xs = list(range(epochs))
    lo = min(min(r.curve) for r in sums.values())
    acc = Svg("Test accuracy (mean over seeds)", "epoch", "test accuracy", (0, epochs - 1),
              (math.floor(lo * 20) / 20, 1.0))
    flo = Svg("Floats sent per worker, cumulative", "epoch", "floats", (0, epochs - 1),
              (10 ** math.floor(math.log10(min(r.cumulative[0] for r in sums.values()))),
               10 ** math.ceil(math.log10(max(r.cumulative[-1] for r in sums.values())))), log_y=True)
    for m in milestones(settings):
        acc.vline(m - 0.5)
        flo.vline(m - 0.5)
    for r in sums.values():
        colour, dash = COLOURS.get(r.method, "#2ca02c"), DASHES.get(r.policy, "")
        acc.line(xs, r.curve, colour, dash, r.label)
        flo.line(xs, r.cumulative, colour, dash, r.label)
    acc.save(os.path.join(out, "accuracy.svg"))
    flo.save(os.path.join(out, "floats.svg"))

    # levels: per Accordion run and seed a grid of layers x epochs
    panels = [(k, r) for k in by_key if by_key[k][0]["policy"].startswith("accordion") for r in by_key[k]]
    cell, rows = 8, len(layers)
    pw, ph = epochs * cell + 20, rows * cell + 34
    w, h = max(1, len(panels)) * pw + 20, ph + 20
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" '
             f'font-size="10"><rect width="{w}" height="{h}" fill="white"/>']
    fill = {"low": "#1f77b4", "high": "#ff7f0e", "dense": "#cccccc"}
    for i, (k, r) in enumerate(panels):
        x0 = 10 + i * pw
        parts.append(f'<text x="{x0}" y="14">{k.replace("-accordion", "")}</text>')
        parts.append(f'<text x="{x0}" y="26">seed {r["seed"]}</text>')
        for e, ep in enumerate(r["epochs"]):
            for j, level in enumerate(ep["levels"]):
                parts.append(f'<rect x="{x0 + e * cell}" y="{32 + j * cell}" width="{cell - 1}" height="{cell - 1}" '
                             f'fill="{fill[level]}"/>')
    with open(os.path.join(out, "levels.svg"), "w") as f:
        f.write("\n".join(parts + ["</svg>\n"]))

    # norm change at each check, seed of the first run
    accordions = [k for k in by_key if by_key[k][0]["policy"].startswith("accordion")]
    height = 300
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="820" height="{height * len(accordions)}">']
    for i, k in enumerate(accordions):
        run = by_key[k][0]
        ratios = []
        for j in range(len(layers)):
            series = [ep["norms"][j] if ep["norms"] else None for ep in run["epochs"]]
            ratios.append([None] + [abs(b - a) / a if a and b is not None else None
                                    for a, b in zip(series, series[1:])])
        values = [v for s in ratios for v in s if v]
        if not values:
            continue
        plot = Svg(f"{run['label']}, seed {run['seed']}: relative norm change at each check", "epoch (check at its end)",
                   "|change| / previous norm", (0, epochs - 1),
                   (10 ** math.floor(math.log10(min(values + [settings['eta']]))),
                    10 ** math.ceil(math.log10(max(values + [settings['eta']])))), log_y=True, h=height)
        for m in milestones(settings):
            plot.vline(m - 0.5)
        palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                   "#bcbd22", "#17becf"]
        shown = 0
        for j, series in enumerate(ratios):
            if any(series):
                plot.line(xs, series, palette[shown % len(palette)], "", layers[j][0] if shown < 18 else None, 1)
                shown += 1
        plot.line([0, epochs - 1], [settings["eta"]] * 2, "#000", "4,2", f"eta {settings['eta']}", 2)
        body = "\n".join(plot.parts[1:])
        parts.append(f'<g transform="translate(0 {i * height})">{body}</g>')
    with open(os.path.join(out, "norms.svg"), "w") as f:
        f.write("\n".join(parts + ["</svg>\n"]))
