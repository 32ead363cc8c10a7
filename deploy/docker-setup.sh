#!/usr/bin/env bash
# Make a Docker engine available to cosched, from Debian's packages; safe to run again.
#
# Installs docker.io (the engine), busybox-static and debootstrap (images are built
# without a registry, see workloads/images.py) and Debian's container seccomp profile
# (golang-github-containers-common; docs/security.md) when missing, enables live-restore so
# containers outlive an engine restart, raises the kernel's file, pty, pid, thread, inotify, epoll and pipe tables to their
# largest (what one job takes of them is then bounded by its memory, not by the host's table), and
# starts dockerd when none answers.
# Root is needed only when something must be installed or started.
set -euo pipefail

need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
dpkg -s busybox-static >/dev/null 2>&1 || need+=(busybox-static)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
# jobs' seccomp profile (docker.seccomp_profile = "auto"; Docker 20.10's own lets jobs use io_uring)
[ -e /usr/share/containers/seccomp.json ] || need+=(golang-github-containers-common)
if [ ${#need[@]} -gt 0 ]; then
    echo "docker-setup: installing ${need[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q "${need[@]}" >/dev/null
fi

if [ ! -e /etc/docker/daemon.json ]; then
    mkdir -p /etc/docker
    echo '{"live-restore": true}' > /etc/docker/daemon.json
elif ! grep -q '"live-restore": *true' /etc/docker/daemon.json; then
    echo "docker-setup: /etc/docker/daemon.json does not enable live-restore; containers die with the engine" >&2
fi

# Kernel tables no cgroup bounds (cosched/daemon/host_limits.py): open files (one job may open
# docker.nofile x docker.pids_limit), ptys (3,072 shared by every container by default), pids, threads
# and inotify instances, epoll watches and pipe buffers (per uid, and every job of docker.job_user is one uid).
# Each at its largest, a job's memory bounds what it takes (the kernel charges each to its cgroup).
sysctls=("fs.file-max=9223372036854775807" "kernel.pty.max=1048576" "kernel.pid_max=4194304"
         "kernel.threads-max=4194304" "fs.inotify.max_user_instances=2147483647"
         "fs.epoll.max_user_watches=9223372036854775807" "fs.pipe-user-pages-soft=0")
for setting in "${sysctls[@]}"; do
    key=${setting%%=*} value=${setting#*=} file=/proc/sys/$(echo "${setting%%=*}" | tr . /)
    [ -e "$file" ] && [ "$(cat "$file")" != "$value" ] || continue
    if [ -w "$file" ]; then
        echo "$value" > "$file"
    else
        echo "docker-setup: $key is $(cat "$file"): jobs can fill the host's table (as root: sysctl $key=$value)" >&2
    fi
done
if [ -d /etc/sysctl.d ] && [ -w /etc/sysctl.d ]; then
    printf '%s\n' "${sysctls[@]/=/ = }" > /etc/sysctl.d/60-cosched.conf
fi

if ! docker info >/dev/null 2>&1; then
    echo "docker-setup: starting dockerd (log: /var/log/dockerd.log)" >&2
    # With the limits of Debian's docker.service, which containers inherit: RLIMIT_NPROC counts a
    # uid's processes on the whole host, and every job of docker.job_user is one uid, so a shell's
    # 96,365 was 23 jobs' worth at docker.pids_limit 4,096 (each job's own is its pids cgroup).
    (
        ulimit -n 1048576 2>/dev/null || true
        ulimit -u unlimited 2>/dev/null || echo "docker-setup: jobs of one uid share $(ulimit -u) processes" >&3
        ulimit -c unlimited 2>/dev/null || true
        exec nohup dockerd 3>&-
    ) 3>&2 >/var/log/dockerd.log 2>&1 &
    for _ in $(seq 1 60); do
        docker info >/dev/null 2>&1 && break
        sleep 1
    done
    docker info >/dev/null 2>&1 || { echo "docker-setup: dockerd did not start; see /var/log/dockerd.log" >&2; exit 1; }
fi
