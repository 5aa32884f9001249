/*
 * The pod sandbox process of the test bed's pause image (localhost/nri-gpu/pause:1).
 *
 * Like Kubernetes' pause: it holds the pod's namespaces open, reaps zombies (it is PID 1
 * of the pod when the pid namespace is shared) and exits 0 on SIGTERM/SIGINT, so
 * StopPodSandbox is quick instead of waiting for the kill timeout (PID 1 ignores
 * signals it has no handler for). Built with: gcc -static -O2 -o pause pause.c
 */
#include <signal.h>
#include <stddef.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_terminate(int sig) {
    (void)sig;
    _exit(0);
}

static void on_child(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction sa = {0};

    sigemptyset(&sa.sa_mask);
    sa.sa_handler = on_terminate;
    if (sigaction(SIGTERM, &sa, NULL) < 0 || sigaction(SIGINT, &sa, NULL) < 0)
        return 1;
    sa.sa_handler = on_child;
    sa.sa_flags = SA_NOCLDSTOP | SA_RESTART;
    if (sigaction(SIGCHLD, &sa, NULL) < 0)
        return 2;
    for (;;)
        pause();
}
