"""The commands of `personaplex-edge`, one module each: `add_parser(sub)`, its flags, beside
`run(args)`, what it does (personaplex_edge/cli.py builds the parser from them). They are front
doors: each reaches the runtime (and `export`, the torch side) only inside `run`, so the parser
builds on a machine with neither extra; `common` holds the flags and loaders several share,
`live` the live loop's status line."""
