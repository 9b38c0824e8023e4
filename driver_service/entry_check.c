/* Checks a shared-object entry point at the driver, before anything starts: the bytes are an
 * ELF shared object that exports a function of the given name (what dlsym in hvd-exec will
 * look for). Reads the dynamic symbol table with libelf; nothing of the object is loaded or
 * run here. */
#include <gelf.h>
#include <libelf.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver_internal.h"

enum { SIMILAR_MAX = 3 }; /* similar names quoted in the error */

static pthread_once_t elf_once = PTHREAD_ONCE_INIT;
static unsigned elf_ready;

static void elf_init(void) {
    elf_ready = elf_version(EV_CURRENT) != EV_NONE;
}

/* What the symbol table says about the name. */
typedef struct lookup {
    const char *want;
    bool found;        /* a defined, visible symbol of that name */
    bool is_function;  /* ... and it is a function */
    char similar[256]; /* exported functions whose name contains want (C++ names, say) */
    size_t nsimilar;
} lookup;

static bool exported(const GElf_Sym *s) {
    int bind = GELF_ST_BIND(s->st_info);
    return s->st_shndx != SHN_UNDEF && (bind == STB_GLOBAL || bind == STB_WEAK) &&
           GELF_ST_VISIBILITY(s->st_other) == STV_DEFAULT;
}

static bool function_type(const GElf_Sym *s) {
    int type = GELF_ST_TYPE(s->st_info);
    return type == STT_FUNC || type == STT_GNU_IFUNC;
}

static void look_at(lookup *lk, const GElf_Sym *s, const char *name) {
    if (!exported(s)) return;
    if (strcmp(name, lk->want) == 0) {
        lk->found = true;
        lk->is_function = function_type(s);
    } else if (function_type(s) && strstr(name, lk->want) && lk->nsimilar++ < SIMILAR_MAX) {
        size_t used = strlen(lk->similar);
        snprintf(lk->similar + used, sizeof lk->similar - used, "%s%.80s",
                 lk->nsimilar > 1 ? ", " : "", name);
    }
}

/* Walks every dynamic symbol table of e. Returns 0, or -1 if it has none. */
static int scan_dynsym(Elf *e, lookup *lk) {
    int tables = 0;
    for (Elf_Scn *scn = elf_nextscn(e, NULL); scn; scn = elf_nextscn(e, scn)) {
        GElf_Shdr sh;
        if (!gelf_getshdr(scn, &sh) || sh.sh_type != SHT_DYNSYM || sh.sh_entsize == 0) continue;
        Elf_Data *data = elf_getdata(scn, NULL);
        if (!data) continue;
        tables++;
        size_t n = sh.sh_size / sh.sh_entsize;
        for (size_t i = 0; i < n; i++) {
            GElf_Sym s;
            const char *name;
            if (gelf_getsym(data, (int)i, &s) && (name = elf_strptr(e, sh.sh_link, s.st_name)))
                look_at(lk, &s, name);
        }
    }
    return tables ? 0 : -1;
}

/* True if e's dynamic section marks it a position-independent program (DF_1_PIE): ET_DYN
 * like a library, but dlopen refuses it. */
static bool is_pie(Elf *e) {
    for (Elf_Scn *scn = elf_nextscn(e, NULL); scn; scn = elf_nextscn(e, scn)) {
        GElf_Shdr sh;
        if (!gelf_getshdr(scn, &sh) || sh.sh_type != SHT_DYNAMIC || sh.sh_entsize == 0) continue;
        Elf_Data *data = elf_getdata(scn, NULL);
        size_t n = data ? sh.sh_size / sh.sh_entsize : 0;
        for (size_t i = 0; i < n; i++) {
            GElf_Dyn dyn;
            if (gelf_getdyn(data, (int)i, &dyn) && dyn.d_tag == DT_FLAGS_1 &&
                (dyn.d_un.d_val & DF_1_PIE))
                return true;
        }
    }
    return false;
}

static int verdict(const lookup *lk, hvd_err *err) {
    if (lk->found && lk->is_function) return 0;
    if (lk->found)
        return hvd_err_set(err, HVD_E_INVALID,
                           "the entry point's symbol '%s' is not a function (a variable?)",
                           lk->want);
    if (lk->nsimilar)
        return hvd_err_set(err, HVD_E_INVALID,
                           "the entry point exports no function named '%s', only similar names "
                           "(%s%s): declare it extern \"C\", or give the exact name",
                           lk->want, lk->similar, lk->nsimilar > SIMILAR_MAX ? ", ..." : "");
    return hvd_err_set(err, HVD_E_INVALID,
                       "the entry point exports no function named '%s': check the name, and that "
                       "it is neither static nor hidden (-fvisibility)",
                       lk->want);
}

int drv_check_entry(const hvd_bytes *object, const char *symbol, hvd_err *err) {
    pthread_once(&elf_once, elf_init);
    if (!elf_ready) return hvd_err_set(err, HVD_E_INTERNAL, "libelf does not work here");
    /* elf_memory may write to the image it reads; the message's bytes stay untouched. */
    char *image = malloc(object->len ? object->len : 1);
    if (!image) return hvd_err_set(err, HVD_E_INTERNAL, "out of memory");
    memcpy(image, object->data, object->len);
    lookup lk = {.want = symbol};
    int rc = 0;
    Elf *e = elf_memory(image, object->len);
    GElf_Ehdr eh;
    if (!e || elf_kind(e) != ELF_K_ELF || !gelf_getehdr(e, &eh))
        rc = hvd_err_set(err, HVD_E_INVALID, "the entry point is not an ELF shared object");
    else if (eh.e_shoff > object->len ||
             (uint64_t)eh.e_shnum * eh.e_shentsize > object->len - eh.e_shoff)
        rc = hvd_err_set(err, HVD_E_INVALID,
                         "the entry point is cut short: %zu bytes, but its ELF header places "
                         "section headers up to byte %llu",
                         object->len,
                         (unsigned long long)eh.e_shoff +
                             (unsigned long long)eh.e_shnum * eh.e_shentsize);
    else if (eh.e_type != ET_DYN || is_pie(e))
        rc = hvd_err_set(err, HVD_E_INVALID,
                         "the entry point is a program, not a shared object: build it with "
                         "-shared -fPIC (or run a program with -- COMMAND)");
    else if (scan_dynsym(e, &lk) != 0)
        rc = hvd_err_set(err, HVD_E_INVALID,
                         "the entry point has no dynamic symbol table, so '%s' cannot be found",
                         symbol);
    else
        rc = verdict(&lk, err);
    if (e) elf_end(e);
    free(image);
    return rc;
}
