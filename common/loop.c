/* The event loop (common/loop.h). Watches are a doubly linked list (epoll's data points at
 * the watch, so nothing is ever searched); timers are a list sorted by due time: few are
 * pending at once (a handful per service). */
#include "common/loop.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "common/clock.h"

#define MAX_EVENTS 256

typedef struct hvd_watch {
    int fd;
    hvd_fd_fn fn; /* NULL once unwatched (an event may still be in the batch) */
    void *arg;
    struct hvd_watch *prev, *next;
} watch;

typedef struct timer {
    uint64_t id;
    int64_t due_ms;
    hvd_loop_fn fn;
    void *arg;
    struct timer *next;
} timer;

typedef struct post {
    hvd_loop_fn fn;
    void *arg;
    struct post *next;
} post;

struct hvd_loop {
    int epfd;
    int wake_fd;      /* eventfd: posts and stop */
    watch wake_watch; /* the watch entry of wake_fd (epoll data points here) */

    pthread_t thread;
    bool started, joined;

    pthread_mutex_t lock; /* guards posts, posts_closed, quit */
    post *posts, *posts_tail;
    bool posts_closed;
    bool quit;

    watch *watches;
    watch *dead_watches; /* unwatched this batch, freed after it */
    timer *timers;       /* sorted by due time */
    uint64_t next_timer_id;
    hvd_loop_fn after_fn;
    void *after_arg;
};

hvd_loop *hvd_loop_create(hvd_err *err) {
    hvd_loop *l = calloc(1, sizeof *l);
    if (!l) {
        hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&l->lock, NULL);
    l->epfd = epoll_create1(EPOLL_CLOEXEC);
    l->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    l->wake_watch.fd = l->wake_fd;
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &l->wake_watch};
    if (l->epfd < 0 || l->wake_fd < 0 || epoll_ctl(l->epfd, EPOLL_CTL_ADD, l->wake_fd, &ev) != 0) {
        hvd_err_set(err, HVD_E_INTERNAL, "cannot create an event loop (epoll, eventfd): %s",
                    strerror(errno));
        hvd_loop_free(l);
        return NULL;
    }
    return l;
}

static void wake(hvd_loop *l) {
    uint64_t one = 1;
    (void)!write(l->wake_fd, &one, sizeof one);
}

/* Runs the posts queued now (not those they post in turn: they wait for the next batch). */
static void run_posts(hvd_loop *l) {
    uint64_t v;
    (void)!read(l->wake_fd, &v, sizeof v);
    pthread_mutex_lock(&l->lock);
    post *p = l->posts;
    l->posts = l->posts_tail = NULL;
    pthread_mutex_unlock(&l->lock);
    while (p) {
        post *next = p->next;
        p->fn(p->arg);
        free(p);
        p = next;
    }
}

static void run_timers(hvd_loop *l) {
    int64_t now = hvd_now_ms();
    while (l->timers && l->timers->due_ms <= now) {
        timer *t = l->timers;
        l->timers = t->next;
        t->fn(t->arg);
        free(t);
    }
}

static int next_wait_ms(const hvd_loop *l) {
    if (!l->timers) return -1;
    return hvd_ms_left(l->timers->due_ms);
}

static void bury_watches(hvd_loop *l) {
    while (l->dead_watches) {
        watch *w = l->dead_watches;
        l->dead_watches = w->next;
        free(w);
    }
}

static bool quitting(hvd_loop *l) {
    pthread_mutex_lock(&l->lock);
    bool q = l->quit;
    pthread_mutex_unlock(&l->lock);
    return q;
}

static void *loop_main(void *arg) {
    hvd_loop *l = arg;
    struct epoll_event evs[MAX_EVENTS];
    while (!quitting(l)) {
        int n = epoll_wait(l->epfd, evs, MAX_EVENTS, next_wait_ms(l));
        if (n < 0 && errno != EINTR) break;
        for (int i = 0; i < n; i++) {
            watch *w = evs[i].data.ptr;
            if (w == &l->wake_watch)
                run_posts(l);
            else if (w->fn)
                w->fn(w->fd, evs[i].events, w->arg);
        }
        run_timers(l);
        if (l->after_fn) l->after_fn(l->after_arg);
        bury_watches(l);
    }
    return NULL;
}

int hvd_loop_start(hvd_loop *l, hvd_err *err) {
    if (l->started) return hvd_err_set(err, HVD_E_STATE, "the event loop is already running");
    int rc = pthread_create(&l->thread, NULL, loop_main, l);
    if (rc != 0)
        return hvd_err_set(err, HVD_E_INTERNAL, "cannot start the event loop thread: %s",
                           strerror(rc));
    l->started = true;
    return 0;
}

void hvd_loop_stop(hvd_loop *l) {
    if (!l) return;
    pthread_mutex_lock(&l->lock);
    bool already = l->posts_closed;
    l->quit = true;
    pthread_mutex_unlock(&l->lock);
    if (already) return;
    if (l->started && !l->joined) {
        wake(l);
        pthread_join(l->thread, NULL);
        l->joined = true;
    }
    pthread_mutex_lock(&l->lock);
    l->posts_closed = true;
    pthread_mutex_unlock(&l->lock);
    run_posts(l);
    bury_watches(l);
}

void hvd_loop_free(hvd_loop *l) {
    if (!l) return;
    hvd_loop_stop(l);
    bury_watches(l);
    while (l->watches) {
        watch *w = l->watches;
        l->watches = w->next;
        free(w);
    }
    while (l->timers) {
        timer *t = l->timers;
        l->timers = t->next;
        free(t);
    }
    if (l->wake_fd >= 0) close(l->wake_fd);
    if (l->epfd >= 0) close(l->epfd);
    pthread_mutex_destroy(&l->lock);
    free(l);
}

bool hvd_loop_on_thread(const hvd_loop *l) {
    return l->started && pthread_equal(pthread_self(), l->thread);
}

int hvd_loop_post(hvd_loop *l, hvd_loop_fn fn, void *arg) {
    post *p = malloc(sizeof *p);
    if (!p) return -1;
    *p = (post){fn, arg, NULL};
    pthread_mutex_lock(&l->lock);
    if (l->posts_closed) {
        pthread_mutex_unlock(&l->lock);
        free(p);
        return -1;
    }
    if (l->posts_tail)
        l->posts_tail->next = p;
    else
        l->posts = p;
    l->posts_tail = p;
    pthread_mutex_unlock(&l->lock);
    wake(l);
    return 0;
}

uint64_t hvd_loop_timer(hvd_loop *l, int delay_ms, hvd_loop_fn fn, void *arg) {
    timer *t = malloc(sizeof *t);
    if (!t) return 0;
    *t = (timer){++l->next_timer_id, hvd_now_ms() + (delay_ms < 0 ? 0 : delay_ms), fn, arg, NULL};
    timer **pp = &l->timers;
    while (*pp && (*pp)->due_ms <= t->due_ms)
        pp = &(*pp)->next;
    t->next = *pp;
    *pp = t;
    return t->id;
}

void hvd_loop_timer_cancel(hvd_loop *l, uint64_t id) {
    for (timer **pp = &l->timers; *pp; pp = &(*pp)->next) {
        if ((*pp)->id == id) {
            timer *t = *pp;
            *pp = t->next;
            free(t);
            return;
        }
    }
}

hvd_watch *hvd_loop_watch(hvd_loop *l, int fd, uint32_t events, hvd_fd_fn fn, void *arg,
                          hvd_err *err) {
    watch *w = calloc(1, sizeof *w);
    if (!w) {
        hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
        return NULL;
    }
    *w = (watch){fd, fn, arg, NULL, l->watches};
    struct epoll_event ev = {.events = events, .data.ptr = w};
    if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        hvd_err_set(err, HVD_E_INTERNAL, "cannot watch fd %d: %s", fd, strerror(errno));
        free(w);
        return NULL;
    }
    if (l->watches) l->watches->prev = w;
    l->watches = w;
    return w;
}

int hvd_loop_watch_events(hvd_loop *l, hvd_watch *w, uint32_t events, hvd_err *err) {
    struct epoll_event ev = {.events = events, .data.ptr = w};
    if (epoll_ctl(l->epfd, EPOLL_CTL_MOD, w->fd, &ev) != 0)
        return hvd_err_set(err, HVD_E_INTERNAL, "cannot watch fd %d: %s", w->fd, strerror(errno));
    return 0;
}

void hvd_loop_unwatch(hvd_loop *l, hvd_watch *w) {
    if (!w) return;
    if (w->prev)
        w->prev->next = w->next;
    else
        l->watches = w->next;
    if (w->next) w->next->prev = w->prev;
    epoll_ctl(l->epfd, EPOLL_CTL_DEL, w->fd, NULL);
    w->fn = NULL;
    w->prev = NULL;
    w->next = l->dead_watches;
    l->dead_watches = w;
}

void hvd_loop_set_after_batch(hvd_loop *l, hvd_loop_fn fn, void *arg) {
    l->after_fn = fn;
    l->after_arg = arg;
}
