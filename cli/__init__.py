"""The `corun` command: engine commands (make-tiny-model, generate, bench), `serve`, `profile` and `plan`."""
