package nodeagent

import "syscall"

func syscallENOSPC() error { return syscall.ENOSPC }
