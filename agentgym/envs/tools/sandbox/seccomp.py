"""A seccomp filter for the strong sandbox: refuse the system calls that only widen the kernel's
attack surface or let code build namespaces of its own, and every socket but an ``AF_UNIX`` one;
allow everything else.

The filter is a classic BPF program (``struct sock_filter`` records) that bubblewrap installs
with ``--seccomp FD`` just before it executes the sandboxed command. A refused call fails with
``EPERM`` (Python raises ``PermissionError``); ``clone3`` fails with ``ENOSYS`` so that libc falls
back to ``clone``, whose flags the filter can inspect. Sockets: a network namespace leaves the
code only a loopback, but some families are not namespaced at all (``AF_VSOCK`` reaches the
hypervisor's host), so ``socket`` and ``socketpair`` are refused for every family but ``AF_UNIX``
(asyncio, multiprocessing and ``socket.socketpair`` need that one; its abstract names are per
network namespace and its paths are the private file system's). Only x86_64 has a table here:
elsewhere ``filter_program()`` returns None and the sandbox reports the ``seccomp`` layer as off.
"""

from __future__ import annotations

import errno
import platform
import struct

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6];
_NR, _ARCH, _ARG0 = 0, 4, 16
AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000
CLONE_NEWUSER = 0x10000000

# BPF instruction codes (linux/bpf_common.h)
_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS: A = data[k]
_JEQ = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_JSET = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_RET = 0x06  # BPF_RET | BPF_K

RET_ALLOW = 0x7FFF0000
RET_KILL_PROCESS = 0x80000000
RET_ERRNO = 0x00050000

# x86_64 numbers of the refused calls, with why.
REFUSED_X86_64 = {
    # namespaces of its own (a user namespace hands out capabilities inside it)
    "unshare": 272,
    "setns": 308,
    # mounts (need privileges the sandbox lacks; refused before the kernel looks further)
    "mount": 165,
    "umount2": 166,
    "pivot_root": 155,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "mount_setattr": 442,
    # kernel keyrings: shared by every process of a uid, so state would outlive the call
    "add_key": 248,
    "request_key": 249,
    "keyctl": 250,
    # large kernel interfaces with a history of privilege escalations
    "bpf": 321,
    "perf_event_open": 298,
    "userfaultfd": 323,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    # looking into or steering other processes, and the kernel log
    "ptrace": 101,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "syslog": 103,
    # file handles (open_by_handle_at was the classic container escape)
    "name_to_handle_at": 303,
    "open_by_handle_at": 304,
    # whole-machine operations (privileged anyway)
    "kexec_load": 246,
    "kexec_file_load": 320,
    "init_module": 175,
    "finit_module": 313,
    "delete_module": 176,
    "reboot": 169,
    "swapon": 167,
    "swapoff": 168,
    "acct": 163,
    "sethostname": 170,
    "setdomainname": 171,
}
CLONE_X86_64 = 56
CLONE3_X86_64 = 435
SOCKET_X86_64 = 41
SOCKETPAIR_X86_64 = 53
AF_UNIX = 1


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def filter_program() -> bytes | None:
    """The BPF program as bytes for bubblewrap's ``--seccomp``, or None on an unsupported machine."""
    if platform.machine() != "x86_64":
        return None
    deny = RET_ERRNO | errno.EPERM
    body = [_insn(_LD_W_ABS, 0, 0, _NR)]
    for nr in REFUSED_X86_64.values():
        body += [_insn(_JEQ, 0, 1, nr), _insn(_RET, 0, 0, deny)]
    body += [
        _insn(_JEQ, 1, 0, SOCKET_X86_64),  # socket(domain, ...) or socketpair(domain, ...):
        _insn(_JEQ, 0, 4, SOCKETPAIR_X86_64),
        _insn(_LD_W_ABS, 0, 0, _ARG0),  # the domain
        _insn(_JEQ, 0, 1, AF_UNIX),
        _insn(_RET, 0, 0, RET_ALLOW),
        _insn(_RET, 0, 0, deny),
        _insn(_JEQ, 0, 1, CLONE3_X86_64),
        _insn(_RET, 0, 0, RET_ERRNO | errno.ENOSYS),
        _insn(_JEQ, 0, 3, CLONE_X86_64),  # clone(flags, ...): refuse CLONE_NEWUSER
        _insn(_LD_W_ABS, 0, 0, _ARG0),  # the low 32 bits of flags (little-endian)
        _insn(_JSET, 0, 1, CLONE_NEWUSER),
        _insn(_RET, 0, 0, deny),
        _insn(_RET, 0, 0, RET_ALLOW),
    ]
    head = [
        _insn(_LD_W_ABS, 0, 0, _ARCH),
        _insn(_JEQ, 1, 0, AUDIT_ARCH_X86_64),
        _insn(_RET, 0, 0, RET_KILL_PROCESS),  # i386 calls: no
        _insn(_LD_W_ABS, 0, 0, _NR),
        _insn(_JGE, 0, 1, X32_SYSCALL_BIT),
        _insn(_RET, 0, 0, deny),  # the x32 ABI: no
    ]
    return b"".join(head + body)
