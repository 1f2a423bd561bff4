# PolyKV: the same set-up as the README's first command, in a container.
#   docker build --build-context shared=../shared -t polykv .
#   docker run --rm -p 127.0.0.1:8501:8501 polykv   # the web app on http://127.0.0.1:8501 (host-local)
#   docker run --rm polykv .venv/bin/polykv generate  # demo generation with the mixed plan
#   docker run --rm polykv bash .ci/run             # the test suite
FROM python:3.11-slim

WORKDIR /opt/polykv
ENV PYTHON=python3.11 \
    POLYKV_HOME=/opt/polykv-home \
    POLYKV_DEMO_CHECKPOINT=/opt/stories260K \
    POLYKV_CORPORA=/opt/corpora \
    HF_HUB_OFFLINE=1 \
    PYTHONUNBUFFERED=1

# Dependencies first so that code edits do not reinstall torch.
COPY requirements.txt pyproject.toml README.md ./
COPY .ci .ci
COPY polykv polykv
RUN bash .ci/setup

# The demo checkpoint comes from the shared folder beside the repository (a named build context).
COPY --from=shared models/stories260K /opt/stories260K
COPY --from=shared corpora /opt/corpora
COPY app app
COPY plans plans
COPY tests tests
COPY benchmarks benchmarks
# Import the demo model once at build time, so the first run starts at once.
RUN .venv/bin/python -c "from polykv.models import demo_model_dir; print(demo_model_dir())"

# Inside the container the app must listen on all of the container's interfaces to be reachable through
# the published port; publish it on the host's loopback only (-p 127.0.0.1:8501:8501).
EXPOSE 8501
CMD [".venv/bin/streamlit", "run", "app/app.py", "--server.address", "0.0.0.0", "--server.headless", "true", \
     "--browser.gatherUsageStats", "false"]
