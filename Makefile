# Each target does all the set-up it needs (venv, package, Docker engine, images) by itself.
.PHONY: demo test test-all test-load bench setup lint docs
demo:
	bash launcher/scripts/dev.sh demo
test:
	bash launcher/scripts/dev.sh test
test-all:
	bash launcher/scripts/dev.sh test-all
test-load:
	bash launcher/scripts/dev.sh test-load
bench:
	bash launcher/scripts/dev.sh bench
setup:
	bash launcher/scripts/dev.sh setup
lint:
	.venv/bin/ruff check launcher tests bench examples && .venv/bin/mypy
docs:
	bash launcher/scripts/dev.sh docs
