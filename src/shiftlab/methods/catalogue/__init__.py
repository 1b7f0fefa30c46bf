"""The method catalogue: what is known about every method without importing torch, read from the method
folders (`methods/<name>/spec.py` and `card.toml`) and nothing else, so that listing the methods, checking
`--methods` and `--set`, the protocols, the published numbers and the methods table answer before torch
is imported.

    declarations.py   what a method declares in its spec.py: `MethodConfig`/`ViewMethodConfig` (the config
                      dataclass bases), `Capabilities` (what it reads, episodic or online, batches),
                      `MethodSpec`, the one config check (`make_config`), and discovery (`spec`,
                      `spec_names`: every folder's spec.py, found by scanning)
    cards.py          a method's card (card.toml beside its spec): paper and BibTeX, published numbers with
                      their sources, the paper protocol and per-dataset values, fidelity, label, aliases,
                      summary, cost rows; `extends` for a family's variant; the rules a published number keeps
    protocols.py      the protocols (`leaderboard`, `paper`) as config overrides read from the cards, layered
                      defaults <- protocol <- per-dataset values <- `--set`
    method_config.py  a run's method names (`tda@pos_alpha=2` variants) and the checked config each method
                      runs with (`effective_config`)
    method_plan.py    `plan_method`: one method resolved as a run (or `create_method`) runs it, the one caller
                      of `effective_config`; what it reads (capabilities, the files its config names)
    listing.py        the catalogue entries (`entries`: what `shiftlab methods` prints and the CLI checks
                      read), the table blocks (single-image, batch-transductive, transductive) and the
                      methods table (`shiftlab methods --table`)

`shiftlab.params` (a config field's declared range and its one check) stays outside: attacks and the run
config declare their fields with it too.
"""
