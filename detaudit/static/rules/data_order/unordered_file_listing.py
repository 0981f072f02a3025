"""A directory listing used in the order the filesystem returns it (DET031 unordered-file-listing)."""

from __future__ import annotations

import libcst as cst

from detaudit.findings import Severity
from detaudit.static.engine.names import dotted_name
from detaudit.static.fixes.edits import Replace
from detaudit.static.rule import Invalid
from detaudit.static.rules.data_order._common import OrderRule, ScopeFlow, Unordered

#: Directory listings in the order the filesystem returns (not sorted).
FILE_LISTING_CALLS = frozenset(
    {"os.listdir", "os.scandir", "os.walk", "os.fwalk", "glob.glob", "glob.iglob",
     "tensorflow.io.gfile.listdir", "tensorflow.io.gfile.glob", "tensorflow.io.gfile.walk"}
)

#: ``pathlib.Path`` methods that list a directory (matched by method name).
FILE_LISTING_METHODS = frozenset({"glob", "rglob", "iterdir"})


_WALKS = frozenset({"os.walk", "os.fwalk", "tensorflow.io.gfile.walk"})
#: Listings whose entries do not compare (``DirEntry``) or that are not flat (walks).
_UNSORTABLE_LISTINGS = _WALKS | {"os.scandir"}


class UnorderedFileListing(OrderRule):
    code = "DET031"
    name = "unordered-file-listing"
    severity = Severity.WARNING
    summary = "A directory listing is used in the order the filesystem returns it."
    rationale = """
        `os.listdir`, `os.scandir`, `os.walk`, `glob.glob`/`iglob` and
        `Path.glob`/`rglob`/`iterdir` return entries in the order the filesystem
        stores them, which differs between machines, filesystems and even copies
        of the same dataset.  When that order becomes data order (a file list a
        Dataset indexes, class indices from `enumerate`, the "first" checkpoint
        matching a pattern, a list that is then shuffled with a seeded RNG), the
        same seed gives different batches on another machine.
        """
    fix_hint = "Sort the listing: `sorted(os.listdir(d))`, `sorted(root.glob('*.png'))`; in `os.walk` sort `dirs[:]` and `files`."
    VALID = (
        "import os, torch\nfiles = sorted(os.listdir('data'))\ndataset = [torch.load(f) for f in files]\n",
        "import glob, torch\nfiles = glob.glob('data/*.pt')\nfiles.sort()\nsamples = [torch.load(f) for f in files]\n",
        "import glob, torch\nfiles = glob.glob('data/*.pt')\nfiles = sorted(files)\nprint(files[0])\n",
        # membership, counting and existence checks do not depend on order
        "import os, torch\nif 'model.pt' in os.listdir('ckpt'):\n    n = len(os.listdir('ckpt'))\nif not os.listdir('out'):\n    torch.save({}, 'out/x.pt')\n",
        # a loop that only has side effects
        "import os, torch\nfor name in os.listdir('tmp'):\n    os.remove(os.path.join('tmp', name))\n",
        "import os, torch\npaths = []\nfor root, dirs, files in os.walk('data'):\n    for f in files:\n        paths.append(os.path.join(root, f))\npaths.sort()\nloader = torch.utils.data.DataLoader(paths)\n",
        "from pathlib import Path\nimport torch\nimages = sorted(p for p in Path('data').rglob('*.png') if p.is_file())\n",
        # exactly one match asserted: a single element has no order
        "import torch\ndef mask_of(folder, name):\n    found = list(folder.glob(name + '.*'))\n"
        "    assert len(found) == 1, found\n    return torch.load(found[0])\n",
        # enumerated for nothing: the count is never read, each file is handled on its own
        "import os, torch\nfor i, name in enumerate(os.listdir('wavs')):\n"
        "    torch.save(torch.load(name), name + '.out')\n",
        # a progress bar over the listing, each file handled on its own
        "import glob, torch\nfrom tqdm import tqdm\nfiles = []\nfiles.extend(glob.glob('in/*.png'))\n"
        "for path in tqdm(files):\n    torch.save(torch.load(path), path + '.out')\n",
        # the first step of a walk is the top directory; its names are only tested for membership
        "import os, torch\nknown = next(os.walk('hub'))[1]\ntrusted = 'owner_repo' in known\n",
    )
    INVALID = (
        Invalid(
            "import os, torch\nfiles = os.listdir('data')\nx = torch.load(files[0])\n",
            line=2,
            message="indexed",
            fixed="import os, torch\nfiles = sorted(os.listdir('data'))\nx = torch.load(files[0])\n",
        ),
        Invalid("import glob, torch\nclass_to_idx = {c: i for i, c in enumerate(glob.glob('train/*'))}\n", line=2, message="enumerate"),
        # the count names the outputs: another order, other names
        Invalid(
            "import os, torch\nfor i, name in enumerate(os.listdir('wavs')):\n    torch.save(torch.load(name), f'{i}.out')\n",
            line=2,
            message="enumerate",
        ),
        Invalid(
            "import os, torch\nclass Images(torch.utils.data.Dataset):\n    def __init__(self, root):\n        self.files = [os.path.join(root, f) for f in os.listdir(root)]\n",
            line=4,
            message="self.files",
        ),
        Invalid("from pathlib import Path\nimport random\nfiles = list(Path('data').glob('*.jpg'))\nrandom.shuffle(files)\n", line=3, message="random.shuffle"),
        Invalid(
            "import os, torch\ndef list_images(root):\n    out = []\n    for root, dirs, files in os.walk(root):\n        for f in files:\n            out.append(f)\n    return out\n",
            line=4,
            message="returned",
        ),
        Invalid("import glob, torch\ndef latest():\n    return glob.glob('ckpt/*.pt')[-1]\n", line=3),
        # a listing per extension, flattened by a nested comprehension into a Dataset's index order
        Invalid(
            "from pathlib import Path\nimport torch\nclass Images(torch.utils.data.Dataset):\n    def __init__(self, folder, exts):\n"
            "        self.paths = [p for ext in exts for p in Path(folder).glob(f'**/*.{ext}')]\n",
            line=5,
            message="self.paths",
        ),
        Invalid("import os, torch\nloader = torch.utils.data.DataLoader(os.listdir('data'))\n", line=2, message="DataLoader"),
    )

    def visit_Call(self, node: cst.Call) -> None:
        call = self.facts.calls[-1]  # the fact collector (first in the walk) just recorded this call
        if call.node is node and self._is_listing(call.qualname, call.method):
            self._mark()

    @staticmethod
    def _is_listing(qualname: str | None, method: str | None) -> bool:
        if qualname is not None:
            return qualname in FILE_LISTING_CALLS
        return method in FILE_LISTING_METHODS

    def source(self, node: cst.CSTNode, flow: ScopeFlow) -> Unordered | None:
        if not isinstance(node, cst.Call):
            return None
        qualname = self.facts.names.resolve(node.func)
        method = node.func.attr.value if isinstance(node.func, cst.Attribute) else None
        if not self._is_listing(qualname, method):
            return None
        label = f"{qualname or method}()"
        fix = None  # DirEntry objects and walk tuples need a key or per-level sorting
        if qualname not in _UNSORTABLE_LISTINGS:
            fix = Replace(node, cst.Call(cst.Name("sorted"), [cst.Arg(node)]))
        return Unordered(label, node, ordered=True, fix=fix, walk=qualname in _WALKS)

    def loop_targets(self, loop: cst.For, flow: ScopeFlow) -> None:
        # ``for root, dirs, files in os.walk(...)``: dirs and files are listings too
        walk = self.source(loop.iter, flow)
        if walk is None or not isinstance(loop.target, cst.Tuple) or len(loop.target.elements) != 3:
            return
        for element in loop.target.elements[1:]:
            name = dotted_name(element.value)
            if name is not None:
                flow.pending[name] = Unordered(f"{walk.what} ({name})", walk.report_at, ordered=True)

    def message(self, value: Unordered, use: str) -> str:
        return f"{value.what} returns entries in filesystem order, and that order is used ({use}); sort it."
