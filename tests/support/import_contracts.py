"""An import-linter contract type the built-in ones cannot express: "this package imports only
the standard library, these modules of ours, and (if allowed) third-party packages". The
built-in `forbidden` type needs every unwanted module named, so a new dependency or a new
subpackage of ours would slip through; this one names what is allowed.

Registered in pyproject.toml ([tool.importlinter] contract_types) and imported by lint-imports
from the repository root as `tests.support.import_contracts`.
"""

from __future__ import annotations

import sys

from grimp import ImportGraph
from importlinter import Contract, ContractCheck, fields, output


def _within(module: str, packages: list[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


class OnlyImportsContract(Contract):
    """Modules of `source_modules` (packages) import only: themselves, the standard library,
    modules of ours under `allowed_modules`, and third-party packages if
    `allow_third_party` is true. Direct imports: each allowed module has contracts of its own.
    """

    type_name = "only_imports"

    source_modules = fields.ListField(subfield=fields.StringField())
    allowed_modules = fields.ListField(subfield=fields.StringField(), required=False, default=[])
    allow_third_party = fields.BooleanField(required=False, default=False)

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        sources = list(self.source_modules)
        allowed = list(self.allowed_modules)
        third_party = bool(self.allow_third_party)
        refused = []
        for source in sources:
            for importer in sorted({source} | graph.find_descendants(source)):
                for imported in sorted(graph.find_modules_directly_imported_by(importer)):
                    if _within(imported, sources) or _within(imported, allowed):
                        continue
                    if imported.split(".")[0] in sys.stdlib_module_names:
                        continue
                    if third_party and graph.is_module_squashed(imported):
                        continue  # squashed: an external package, never one of ours
                    lines = [
                        d["line_number"]
                        for d in graph.get_import_details(importer=importer, imported=imported)
                    ]
                    refused.append((importer, imported, lines))
        return ContractCheck(kept=not refused, metadata={"refused": refused})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for importer, imported, lines in check.metadata["refused"]:
            where = ", ".join(f"l.{n}" for n in lines)
            output.print_error(f"{importer} imports {imported} ({where})", bold=False)
        output.new_line()
