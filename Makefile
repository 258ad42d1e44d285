# The two commands of the README, plus developer conveniences. Everything goes through infra/bootstrap.sh,
# which creates or reuses the virtualenv and installs the project with its dev extras.
.PHONY: demo test proto lint bench lock clean

demo:
	@bash infra/bootstrap.sh demo

test:
	@bash infra/bootstrap.sh test

bench:
	@bash infra/bootstrap.sh bench

lint:
	@bash infra/bootstrap.sh lint

lock:
	@bash infra/bootstrap.sh lock

proto:
	@bash infra/bootstrap.sh proto

clean:
	rm -rf .venv .bkaudit checkpoints/* lakehouse
