# TEST DEVICE ONLY - stands in for python:3.12.8-slim-bookworm where no registry can be reached.
# Context: a directory holding bookworm-rootfs.tar (debootstrap, made by images/standin/bases.sh).
# The shim is one venv: the official image has python and pip in /usr/local/bin; a venv rooted
# at /usr/local puts Debian's python3 (3.11, not 3.12.8) and pip there.
FROM scratch
ADD bookworm-rootfs.tar /
RUN python3 -m venv /usr/local
ENV LANG=C.UTF-8
CMD ["python3"]
