"""The one model reader of the host side (docs/probe.md, "Which targets"); only `files`
imports without torch."""
