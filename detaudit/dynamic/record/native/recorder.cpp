// OpTracer.record, compiled: the tracer's hot path for the common op.
//
// tracer.py's OpTracer.record is the reference: dispatch() does what it does,
// step for step, on the same state (the tracer's records, digests, staged
// digests, storage tables, forward sites, last outputs and user-frame cache),
// so the two recorders can take turns within one trace and leave the same
// one.  The storage tables are compiled here too (StorageTables, the twin of
// storage_tables.py's): the Python recorder calls their methods, this file
// reads them directly.  What is rare or more than bookkeeping stays in
// Python: an op with a capture asked for, a collective communication (or
// any op while one is pending), an op with a storage argument and an op on a
// tensor subclass other than Parameter go to OpTracer.record whole; a digest
// other than a contiguous CPU tensor's (a CRC-32 when small, words_digest's
// weighted sum when large) goes to OpTracer._stage_digest.  Built and loaded
// by native/__init__.py; held to the Python recorder by
// tests/test_dynamic_native.py, and words_digest to numpy by
// tests/test_dynamic_digests.py.
//
// Every Python object here is an owned reference held by Ref, or borrowed
// from something that outlives its use (the op's arguments, the tracer).
// Everything runs with the GIL held (a Python mode's dispatch takes it), so
// the process-wide caches below need no lock.

#include <Python.h>
#include <unordered_set>
#include <frameobject.h>

#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/DynamicTypes.h>
// function.h, not node.h: torch 2.11 (seen on the GPU machine) defines Node there and has no node.h
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/python_variable.h>

#include <dlfcn.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstring>
#include <memory>

#include <unordered_map>
#include <vector>

namespace {

// An owned reference.
class Ref {
 public:
  Ref() = default;
  explicit Ref(PyObject* object) : object_(object) {}  // steals
  Ref(const Ref&) = delete;
  Ref& operator=(const Ref&) = delete;
  Ref(Ref&& other) noexcept : object_(other.release()) {}
  Ref& operator=(Ref&& other) noexcept {
    reset(other.release());
    return *this;
  }
  ~Ref() { Py_XDECREF(object_); }
  static Ref borrow(PyObject* object) {
    Py_XINCREF(object);
    return Ref(object);
  }
  PyObject* get() const { return object_; }
  PyObject* release() {
    PyObject* object = object_;
    object_ = nullptr;
    return object;
  }
  void reset(PyObject* object = nullptr) {
    Py_XDECREF(object_);
    object_ = object;
  }
  explicit operator bool() const { return object_ != nullptr; }

 private:
  PyObject* object_ = nullptr;
};

// tracer.py's constants and helpers, given once by configure().
struct Constants {
  PyObject* plain_types;  // _PLAIN_ARG_TYPES
  PyObject* parameter_type;  // torch.nn.Parameter
  PyObject* crc32;  // zlib.crc32
  PyObject* result_meta;  // _result_meta
  PyObject* user_files;  // watch._USER_FILES: filename -> is_user_file(filename)
  PyObject* is_user_file;  // watch.is_user_file
  long resumable_code;  // watcher.RESUMABLE_CODE: code flags of generators and coroutines
  PyObject *forward, *backward, *optimizer, *setup;  // phases
  PyObject *produced, *allocated, *external;  // leaf kinds
  PyObject *empty_str, *zero, *one, *uninit, *unread;
  int64_t uninit_id;  // uninit's value
  Py_ssize_t crc_max_bytes, stage_limit;
  size_t min_forget_at;  // storage_tables.MIN_FORGET_AT
  uint64_t weight_multiplier, chunk_multiplier;  // digests.host_digest's weighted sum
  int64_t chunk_words;
};
Constants constants;

// The attribute and method names this file reads, interned at import.
struct Names {
  PyObject *records, *digests, *staged, *tables, *forward_sites,
      *last_outputs, *user_frames, *watcher, *observer, *capture_ops, *communications, *pending,
      *allocation_fill, *host_digests, *out_meta, *dispatching, *in_optimizer, *training_started, *module_stack, *steps,
      *caller, *user, *record, *paused, *bound, *before_op, *after_op, *info, *stage_digest,
      *fill_allocation, *meta, *flush, *name, *call, *is_allocation, *is_seeded, *is_view, *flat_args,
      *single_result, *untraced, *python_only, *returns_python, *written_args, *unread_args, *name_attr;
};
Names names;

// What record() needs of an op overload, read once from its tracer._OpInfo.
struct OpInfo {
  Ref op;  // held: its address keys this entry
  Ref name, call;
  bool is_allocation, is_seeded, is_view, flat_args, single_result, untraced, python_only, returns_python;
  std::vector<std::pair<Py_ssize_t, Ref>> written_args, unread_args;  // (position, keyword name)
};
// Never destroyed: its Refs would be released by the C runtime's exit, after the
// interpreter has finalized (a segfault at every traced process's exit, seen with
// Python 3.12 on the GPU machine).
std::unordered_map<PyObject*, OpInfo>& op_infos = *new std::unordered_map<PyObject*, OpInfo>;

bool truthy_attr(PyObject* object, PyObject* name, bool* value) {
  Ref attribute(PyObject_GetAttr(object, name));
  if (!attribute) return false;
  int truth = PyObject_IsTrue(attribute.get());
  if (truth < 0) return false;
  *value = truth;
  return true;
}

bool read_arguments(PyObject* info, PyObject* name, std::vector<std::pair<Py_ssize_t, Ref>>* into) {
  Ref list(PyObject_GetAttr(info, name));
  if (!list) return false;
  Ref iterator(PyObject_GetIter(list.get()));
  if (!iterator) return false;
  while (Ref item{PyIter_Next(iterator.get())}) {
    Py_ssize_t position = PyLong_AsSsize_t(PyTuple_GET_ITEM(item.get(), 0));
    into->emplace_back(position, Ref::borrow(PyTuple_GET_ITEM(item.get(), 1)));
  }
  return !PyErr_Occurred();
}

const OpInfo* op_info(PyObject* tracer, PyObject* func) {
  auto found = op_infos.find(func);
  if (found != op_infos.end()) return &found->second;
  Ref info(PyObject_CallMethodOneArg(tracer, names.info, func));
  if (!info) return nullptr;
  OpInfo entry;
  entry.op = Ref::borrow(func);
  entry.name = Ref(PyObject_GetAttr(info.get(), names.name));
  entry.call = Ref(PyObject_GetAttr(info.get(), names.call));
  bool python_only = false, returns_python = false;
  if (!entry.name || !entry.call || !truthy_attr(info.get(), names.is_allocation, &entry.is_allocation) ||
      !truthy_attr(info.get(), names.is_seeded, &entry.is_seeded) ||
      !truthy_attr(info.get(), names.is_view, &entry.is_view) ||
      !truthy_attr(info.get(), names.flat_args, &entry.flat_args) ||
      !truthy_attr(info.get(), names.single_result, &entry.single_result) ||
      !truthy_attr(info.get(), names.untraced, &entry.untraced) ||
      !truthy_attr(info.get(), names.python_only, &python_only) ||
      !truthy_attr(info.get(), names.returns_python, &returns_python) ||
      !read_arguments(info.get(), names.written_args, &entry.written_args) ||
      !read_arguments(info.get(), names.unread_args, &entry.unread_args))
    return nullptr;
  entry.python_only = python_only;
  entry.returns_python = returns_python;
  return &op_infos.emplace(func, std::move(entry)).first->second;
}

// ``tuple``, taken off the garbage collector's lists: for a tuple made here
// of numbers, strings, dtypes and such tuples, which can never be part of a
// cycle (CPython's collector would untrack it on its first pass over it; the
// trace keeps several per op, and until then every collection walks them).
PyObject* untracked(PyObject* tuple) {
  if (tuple != nullptr) PyObject_GC_UnTrack(tuple);
  return tuple;
}

// Per-op sequences: on the stack for the usual handful of items, no heap allocation
using Objects = c10::SmallVector<PyObject*, 8>;  // borrowed
using Refs = c10::SmallVector<Ref, 8>;

// The leaves of nested lists and tuples (OpTracer's _flatten), borrowed.
void flatten(PyObject* value, Objects* into) {
  if (PyList_CheckExact(value) || PyTuple_CheckExact(value)) {
    Py_ssize_t size = PySequence_Fast_GET_SIZE(value);
    PyObject** items = PySequence_Fast_ITEMS(value);
    for (Py_ssize_t i = 0; i < size; ++i) flatten(items[i], into);
  } else {
    into->push_back(value);
  }
}

bool is_tensor(PyObject* value) { return THPVariable_Check(value); }

// A tensor whose methods no Python subclass can have changed.
bool is_plain_tensor(PyObject* value) {
  return THPVariable_CheckExact(value) || reinterpret_cast<PyObject*>(Py_TYPE(value)) == constants.parameter_type;
}

// zlib's crc32, the library Python's zlib module is linked with; null: call zlib.crc32 through Python
using Crc32Function = unsigned long (*)(unsigned long, const unsigned char*, unsigned int);
Crc32Function zlib_crc32 = nullptr;

Crc32Function find_zlib_crc32() {
  // by name from libz itself: another library in the process may have a crc32 of its own
  void* library = dlopen("libz.so.1", RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);
  if (library == nullptr) library = dlopen("libz.so.1", RTLD_LAZY | RTLD_LOCAL);
  return reinterpret_cast<Crc32Function>(library ? dlsym(library, "crc32") : nullptr);
}

// *crc := zlib.crc32(data, *crc): CRC-32 continues over consecutive pieces
bool crc32_update(const void* data, Py_ssize_t size, unsigned long* crc) {
  if (zlib_crc32 != nullptr && size <= 0x7fffffff) {
    *crc = zlib_crc32(*crc, static_cast<const unsigned char*>(data), static_cast<unsigned int>(size));
    return true;
  }
  Ref view(PyMemoryView_FromMemory(static_cast<char*>(const_cast<void*>(data)), size, PyBUF_READ));
  Ref start(PyLong_FromUnsignedLong(*crc));
  Ref result(view && start ? PyObject_CallFunctionObjArgs(constants.crc32, view.get(), start.get(), nullptr) : nullptr);
  if (!result) return false;
  *crc = PyLong_AsUnsignedLong(result.get());
  return !PyErr_Occurred();
}

PyObject* crc32_of(const void* data, Py_ssize_t size) {
  unsigned long crc = 0;
  return crc32_update(data, size, &crc) ? PyLong_FromUnsignedLong(crc) : nullptr;
}

// storage_tables.StorageTables, compiled: the same two tables, keyed by the
// C++ storage object and holding plain numbers, so that neither a lookup nor
// an entry makes a Python object.  A storage is held by a weak pointer: it
// keeps the StorageImpl object (not its bytes) from being freed, so while an
// entry names an address no other storage can take it, and an entry whose
// storage died (expired) never matches again.
using WeakStorage = c10::weak_intrusive_ptr<c10::StorageImpl>;

// The tensor's storage; null for a layout without one, or whose storage may not be touched.
const c10::Storage* storage_of(const at::Tensor& tensor) {
  if (!tensor.has_storage()) return nullptr;
  try {
    return &tensor.storage();
  } catch (const c10::Error&) {  // (functional and other wrapper tensors forbid it)
    return nullptr;
  }
}

// storage_tables._layout_key: the storage, offset and dtype, then the sizes and strides.
struct LayoutKey {
  const c10::StorageImpl* storage;
  int64_t offset;
  c10::ScalarType dtype;
  c10::SmallVector<int64_t, 8> sizes_and_strides;

  LayoutKey(const c10::Storage& of, const at::Tensor& tensor)
      : storage(of.unsafeGetStorageImpl()), offset(tensor.storage_offset()), dtype(tensor.scalar_type()) {
    sizes_and_strides.append(tensor.sizes().begin(), tensor.sizes().end());
    sizes_and_strides.append(tensor.strides().begin(), tensor.strides().end());
  }
  bool operator==(const LayoutKey& other) const {
    return storage == other.storage && offset == other.offset && dtype == other.dtype &&
           sizes_and_strides == other.sizes_and_strides;
  }
};
struct LayoutKeyHash {
  size_t operator()(const LayoutKey& key) const {
    uint64_t hash = reinterpret_cast<uintptr_t>(key.storage);
    auto mix = [&hash](uint64_t value) { hash = ((hash ^ value) * 0x100000001B3ull) ^ (hash >> 29); };
    mix(static_cast<uint64_t>(key.offset));
    mix(static_cast<uint64_t>(key.dtype));
    for (int64_t value : key.sizes_and_strides) mix(static_cast<uint64_t>(value));
    return hash;
  }
};

// The tensor's version counter; an inference tensor has none (asking raises): version 0, as
// storage_tables.version_of says.
int64_t version_of(const at::Tensor& tensor) { return tensor.is_inference() ? 0 : tensor._version(); }

uint64_t chunked_words_digest(const unsigned char* bytes, int64_t words, uint64_t digest, uint64_t multiplier,
                              int64_t chunk_words, uint64_t chunk_multiplier, bool portable);

class StorageTables {
 public:
  // The digest id of the tensor's bytes at its current version, if known.
  bool known(const at::Tensor& tensor, int64_t* digest_id) const {
    const c10::Storage* storage = storage_of(tensor);
    if (storage == nullptr) return false;
    auto found = digests_.find(LayoutKey(*storage, tensor));
    if (found == digests_.end() || !holds(found->second.storage, *storage)) return false;
    int64_t version = version_of(tensor);
    if (version < found->second.first_version || version > found->second.last_version) return false;
    *digest_id = found->second.digest_id;
    return true;
  }

  // (kind, record index) of where the storage's contents came from; a storage no traced op made is external from here on.
  std::pair<PyObject*, int64_t> origin(const at::Tensor& tensor, int64_t record_index) {
    const c10::Storage* storage = storage_of(tensor);
    if (storage == nullptr) return {constants.external, record_index};
    if (const OriginEntry* known = known_origin(*storage)) return {known->kind, known->record_index};
    set_origin(*storage, constants.external, record_index);
    return {constants.external, record_index};
  }

  // An allocation op made the tensor: its bytes are uninitialized.
  void allocated(const at::Tensor& tensor, int64_t record_index) {
    const c10::Storage* storage = storage_of(tensor);
    if (storage == nullptr) return;
    set_origin(*storage, constants.allocated, record_index);
    remember(tensor, version_of(tensor), constants.uninit_id, false);
  }

  // An op wrote the tensor's bytes; a write to part of a storage leaves the rest's known origin.
  void produced(const at::Tensor& tensor, int64_t record_index, bool written) {
    const c10::Storage* storage = storage_of(tensor);
    if (storage == nullptr) return;
    if (written && tensor.nbytes() < storage->nbytes() && known_origin(*storage) != nullptr) return;
    set_origin(*storage, constants.produced, record_index);
  }

  // Readers of the tensor's bytes at version (and the next, when written in place) read digest_id.
  void remember(const at::Tensor& tensor, int64_t version, int64_t digest_id, bool written) {
    const c10::Storage* storage = storage_of(tensor);
    if (storage == nullptr) return;
    digests_.insert_or_assign(LayoutKey(*storage, tensor),
                              DigestEntry{storage->getWeakStorageImpl(), version, version + written, digest_id});
    if (size() > forget_at_) forget_dead_storages();
  }

  // The tensors' bytes changed where no version counter saw it (inside a wrapper subclass's
  // in-place op): forget every digest known for their storages.
  void forget_digests(const std::vector<at::Tensor>& tensors) {
    std::unordered_set<const c10::StorageImpl*> written;
    for (const at::Tensor& tensor : tensors) {
      if (const c10::Storage* storage = storage_of(tensor)) written.insert(storage->unsafeGetStorageImpl());
    }
    if (written.empty()) return;
    for (auto entry = digests_.begin(); entry != digests_.end();) {
      entry = written.count(entry->first.storage) ? digests_.erase(entry) : std::next(entry);
    }
  }

  size_t size() const { return digests_.size() + origins_.size(); }

 private:
  struct DigestEntry {
    WeakStorage storage;
    int64_t first_version, last_version, digest_id;
  };
  struct OriginEntry {
    WeakStorage storage;
    PyObject* kind;  // constants.produced, allocated or external
    int64_t record_index;
  };

  static bool holds(const WeakStorage& entry, const c10::Storage& storage) {
    return entry._unsafe_get_target() == storage.unsafeGetStorageImpl() && !entry.expired();
  }

  const OriginEntry* known_origin(const c10::Storage& storage) const {
    auto found = origins_.find(storage.unsafeGetStorageImpl());
    return found != origins_.end() && holds(found->second.storage, storage) ? &found->second : nullptr;
  }

  void set_origin(const c10::Storage& storage, PyObject* kind, int64_t record_index) {
    origins_.insert_or_assign(storage.unsafeGetStorageImpl(), OriginEntry{storage.getWeakStorageImpl(), kind, record_index});
  }

  template <typename Table>
  static void erase_expired(Table& table) {
    for (auto entry = table.begin(); entry != table.end();) {
      entry = entry->second.storage.expired() ? table.erase(entry) : std::next(entry);
    }
  }

  void forget_dead_storages() {
    erase_expired(digests_);
    erase_expired(origins_);
    forget_at_ = std::max(constants.min_forget_at, 2 * size());
  }

  std::unordered_map<LayoutKey, DigestEntry, LayoutKeyHash> digests_;
  std::unordered_map<const c10::StorageImpl*, OriginEntry> origins_;
  size_t forget_at_ = constants.min_forget_at;
};

// The Python object: native_record.StorageTables(), with storage_tables.StorageTables' methods.
struct TablesObject {
  PyObject_HEAD
  StorageTables* tables;
};
PyTypeObject* tables_type = nullptr;

PyObject* origin_tuple(std::pair<PyObject*, int64_t> origin) {
  Ref record_index(PyLong_FromLongLong(origin.second));
  return record_index ? untracked(PyTuple_Pack(2, origin.first, record_index.get())) : nullptr;
}

// What a tracer never replaces while it lives (OpTracer.__init__ makes
// them): read once, when its mode is made (bind), and kept by the mode.
struct Bound {
  PyObject* tracer;  // borrowed: the mode that keeps this holds the tracer
  Ref records, digests, staged, forward_sites, out_meta, capture_ops, pending, user_frames;
  Ref tables;  // the tracer's compiled StorageTables
  bool host_digests = true;
};
const char* const BOUND_NAME = "detaudit.native_record.Bound";

// The tracer's state for one op.
struct Tracer {
  const Bound& bound;
  PyObject* self;
  PyObject *records, *digests, *staged, *forward_sites, *out_meta;  // bound's
  StorageTables& tables;
  Ref watcher;  // attached after the mode is made
  bool host_digests;

  explicit Tracer(const Bound& state)
      : bound(state), self(state.tracer), records(state.records.get()), digests(state.digests.get()),
        staged(state.staged.get()), forward_sites(state.forward_sites.get()), out_meta(state.out_meta.get()),
        tables(*reinterpret_cast<TablesObject*>(state.tables.get())->tables), host_digests(state.host_digests) {}

  bool load() {
    watcher = Ref(PyObject_GetAttr(self, names.watcher));
    return static_cast<bool>(watcher);
  }

  // OpTracer._stage_digest, with a contiguous CPU tensor's digest (digests.host_digest's)
  // taken here: the digest id into *digest_id, and as a new reference
  PyObject* stage_digest(PyObject* object, const at::Tensor& tensor, int64_t* digest_id) {
    if (host_digests && tensor.is_cpu() && tensor.layout() == c10::kStrided && tensor.is_contiguous() &&
        !tensor.is_conj() && !tensor.is_neg()) {
      const auto size = static_cast<Py_ssize_t>(tensor.nbytes());
      const auto* bytes = static_cast<const unsigned char*>(size ? tensor.const_data_ptr() : nullptr);
      Ref digest;
      if (size < constants.crc_max_bytes) {
        digest = size ? Ref(crc32_of(bytes, size)) : Ref::borrow(constants.zero);
      } else {
        unsigned long tail = 0;  // the CRC-32 of the last 0-7 bytes
        if (!crc32_update(bytes + size / 8 * 8, size % 8, &tail)) return nullptr;
        digest = Ref(PyLong_FromUnsignedLongLong(chunked_words_digest(bytes, size / 8, tail, constants.weight_multiplier,
                                                                      constants.chunk_words, constants.chunk_multiplier, false)));
      }
      if (!digest) return nullptr;
      *digest_id = PyList_GET_SIZE(digests) + PyList_GET_SIZE(staged);
      if (PyList_Append(staged, digest.get()) < 0) return nullptr;
      return PyLong_FromLongLong(*digest_id);
    }
    PyObject* staged_id = PyObject_CallMethodOneArg(self, names.stage_digest, object);
    if (staged_id != nullptr) *digest_id = PyLong_AsLongLong(staged_id);
    return staged_id;
  }
};

// A shape as a tuple of ints (equal to, and hashed as, torch.Size).
PyObject* int_tuple(c10::IntArrayRef values) {
  Ref tuple(PyTuple_New(values.size()));
  if (!tuple) return nullptr;
  for (size_t i = 0; i < values.size(); ++i) {
    PyObject* value = PyLong_FromLongLong(values[i]);
    if (!value) return nullptr;
    PyTuple_SET_ITEM(tuple.get(), i, value);
  }
  return untracked(tuple.release());
}

PyObject* dtype_of(const at::Tensor& tensor) {
  return reinterpret_cast<PyObject*>(torch::getTHPDtype(tensor.scalar_type()));
}

// OpTracer._input_ref: (digest id, origin or null) into *digest_id and *origin.
bool input_ref(Tracer& tracer, PyObject* object, int64_t record_index, Ref* digest_id, Ref* origin) {
  const at::Tensor& tensor = THPVariable_Unpack(object);
  int64_t known;
  if (tracer.tables.known(tensor, &known)) {
    digest_id->reset(PyLong_FromLongLong(known));
    // an untouched allocation is reported with its origin: reading it is a bug
    origin->reset(known == constants.uninit_id ? origin_tuple(tracer.tables.origin(tensor, record_index)) : nullptr);
    return *digest_id && (known != constants.uninit_id || *origin);
  }
  origin->reset(origin_tuple(tracer.tables.origin(tensor, record_index)));
  if (!*origin) return false;
  int64_t staged_id;
  digest_id->reset(tracer.stage_digest(object, tensor, &staged_id));
  if (!*digest_id) return false;
  tracer.tables.remember(tensor, version_of(tensor), staged_id, false);
  return true;
}

// OpTracer._output_ref: a new reference to the digest id, Py_None for a view, null on error.
PyObject* output_ref(Tracer& tracer, PyObject* object, const OpInfo& info, int64_t record_index, bool written,
                     PyObject* view_of, int64_t view_of_id) {
  const at::Tensor& tensor = THPVariable_Unpack(object);
  int64_t digest_id;
  if (storage_of(tensor) == nullptr) return tracer.stage_digest(object, tensor, &digest_id);
  if (info.is_view && !written) {
    // a view as large as its input reads all of it: its readers take the input's digest
    if (view_of != nullptr && tensor.numel() >= THPVariable_Unpack(view_of).numel()) {
      tracer.tables.remember(tensor, version_of(THPVariable_Unpack(view_of)), view_of_id, false);
    }
    Py_RETURN_NONE;
  }
  if (info.is_allocation) {
    tracer.tables.allocated(tensor, record_index);
    return Ref::borrow(constants.uninit).release();
  }
  tracer.tables.produced(tensor, record_index, written);
  PyObject* staged_id = tracer.stage_digest(object, tensor, &digest_id);
  if (staged_id != nullptr) tracer.tables.remember(tensor, version_of(tensor), digest_id, written);
  return staged_id;
}

// OpTracer.note_forward_sites
bool note_forward_sites(Tracer& tracer, PyObject* last_outputs) {
  Ref held = Ref::borrow(last_outputs);
  if (PyObject_SetAttr(tracer.self, names.last_outputs, Py_None) < 0) return false;
  PyObject* outputs = PyTuple_GET_ITEM(last_outputs, 0);
  PyObject* site = PyTuple_GET_ITEM(last_outputs, 1);
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(outputs); ++i) {
    PyObject* output = PyWeakref_GetObject(PyList_GET_ITEM(outputs, i));
    if (output == Py_None) continue;
    auto grad_fn = THPVariable_Unpack(output).grad_fn();
    if (!grad_fn) continue;
    Ref sequence_nr(PyLong_FromUnsignedLongLong(grad_fn->sequence_nr()));
    if (!sequence_nr || !PyDict_SetDefault(tracer.forward_sites, sequence_nr.get(), site)) return false;
  }
  return true;
}

// frame.f_lineno, remembered per code object and instruction: CPython finds
// a line by scanning the code's line table from its start, and consecutive
// ops mostly come from the same few instructions.  The cache holds the code
// objects it names, and is emptied when full.
struct LineKey {
  PyObject* code;
  int instruction;
  bool operator==(const LineKey& other) const { return code == other.code && instruction == other.instruction; }
};
struct LineKeyHash {
  size_t operator()(const LineKey& key) const {
    return std::hash<const void*>()(key.code) ^ (static_cast<size_t>(key.instruction) * 0x9E3779B97F4A7C15ull);
  }
};
std::unordered_map<LineKey, int, LineKeyHash> line_numbers;
const size_t LINE_CACHE_SIZE = 4096;

int line_number(PyFrameObject* frame, PyObject* code) {
#if PY_VERSION_HEX >= 0x030B0000
  LineKey key{code, PyFrame_GetLasti(frame)};
  auto found = line_numbers.find(key);
  if (found != line_numbers.end()) return found->second;
  if (line_numbers.size() >= LINE_CACHE_SIZE) {
    for (auto& entry : line_numbers) Py_DECREF(entry.first.code);
    line_numbers.clear();
  }
  int line = PyFrame_GetLineNumber(frame);
  Py_INCREF(code);
  line_numbers.emplace(key, line);
  return line;
#else
  return PyFrame_GetLineNumber(frame);
#endif
}

// watch.user_frame(start): the innermost frame of user code, or Py_None
Ref user_frame(PyObject* start) {
  Ref frame = Ref::borrow(start);
  while (frame) {
    Ref code(reinterpret_cast<PyObject*>(PyFrame_GetCode(reinterpret_cast<PyFrameObject*>(frame.get()))));
    PyObject* filename = reinterpret_cast<PyCodeObject*>(code.get())->co_filename;
    PyObject* is_user = PyDict_GetItemWithError(constants.user_files, filename);
    Ref asked;
    if (is_user == nullptr) {
      if (PyErr_Occurred()) return Ref();
      asked = Ref(PyObject_CallOneArg(constants.is_user_file, filename));
      if (!asked || PyDict_SetItem(constants.user_files, filename, asked.get()) < 0) return Ref();
      is_user = asked.get();
    }
    if (is_user == Py_True) return frame;
    frame = Ref(reinterpret_cast<PyObject*>(PyFrame_GetBack(reinterpret_cast<PyFrameObject*>(frame.get()))));
  }
  return Ref::borrow(Py_None);
}

// watcher.UserFrames.find(caller), on that object's state: the user frame
// above the frame that dispatched an op, remembered for that frame unless a
// resumable frame (generator, coroutine) lies between the two.
Ref find_user_frame(PyObject* user_frames, PyObject* caller) {
  Ref user = user_frame(caller);
  if (!user) return Ref();
  Ref frame = Ref::borrow(caller);
  while (frame && frame.get() != user.get()) {
    Ref code(reinterpret_cast<PyObject*>(PyFrame_GetCode(reinterpret_cast<PyFrameObject*>(frame.get()))));
    if (reinterpret_cast<PyCodeObject*>(code.get())->co_flags & constants.resumable_code) break;
    frame = Ref(reinterpret_cast<PyObject*>(PyFrame_GetBack(reinterpret_cast<PyFrameObject*>(frame.get()))));
  }
  bool remembered = frame.get() == user.get() || (!frame && user.get() == Py_None);
  if (PyObject_SetAttr(user_frames, names.caller, remembered ? caller : Py_None) < 0 ||
      PyObject_SetAttr(user_frames, names.user, user.get()) < 0)
    return Ref();
  return user;
}

// OpTracer._site: a new (phase, file, line, module) tuple.
PyObject* site_of(Tracer& tracer, PyObject* caller) {
  PyObject* phase;
  auto node = torch::autograd::get_current_node();
  if (node) {
    Ref sequence_nr(PyLong_FromUnsignedLongLong(node->sequence_nr()));
    if (!sequence_nr) return nullptr;
    PyObject* site = PyDict_GetItemWithError(tracer.forward_sites, sequence_nr.get());
    if (site) {
      return untracked(PyTuple_Pack(4, constants.backward, PyTuple_GET_ITEM(site, 0), PyTuple_GET_ITEM(site, 1),
                                 PyTuple_GET_ITEM(site, 2)));
    }
    if (PyErr_Occurred()) return nullptr;
    phase = constants.backward;
  } else {
    // tracer.py's _phase_outside_autograd
    bool in_optimizer = false, started = true;
    PyObject* watcher = tracer.watcher.get();
    if (watcher != Py_None && (!truthy_attr(watcher, names.in_optimizer, &in_optimizer) ||
                               (!in_optimizer && !truthy_attr(watcher, names.training_started, &started))))
      return nullptr;
    phase = in_optimizer ? constants.optimizer : started ? constants.forward : constants.setup;
  }
  Ref frame;
  if (caller != nullptr) {
    PyObject* user_frames = tracer.bound.user_frames.get();
    Ref cached(PyObject_GetAttr(user_frames, names.caller));
    if (!cached) return nullptr;
    frame = cached.get() == caller ? Ref(PyObject_GetAttr(user_frames, names.user)) : find_user_frame(user_frames, caller);
    if (!frame) return nullptr;
  }
  // TrainingWatcher.current_module, read from its stack without running the property
  Ref module = Ref::borrow(constants.empty_str);
  if (tracer.watcher.get() != Py_None) {
    Ref stack(PyObject_GetAttr(tracer.watcher.get(), names.module_stack));
    if (!stack) return nullptr;
    Py_ssize_t depth = PyList_Check(stack.get()) ? PyList_GET_SIZE(stack.get()) : 0;
    if (depth > 0) module = Ref::borrow(PyList_GET_ITEM(stack.get(), depth - 1));
  }
  if (!frame || frame.get() == Py_None) return untracked(PyTuple_Pack(4, phase, constants.empty_str, constants.zero, module.get()));
  PyFrameObject* user = reinterpret_cast<PyFrameObject*>(frame.get());
  Ref code(reinterpret_cast<PyObject*>(PyFrame_GetCode(user)));
  Ref line(PyLong_FromLong(line_number(user, code.get())));
  if (!code || !line) return nullptr;
  return untracked(PyTuple_Pack(4, phase, reinterpret_cast<PyCodeObject*>(code.get())->co_filename, line.get(), module.get()));
}

// repr() of floats and ints, remembered by their 64 bits: a float's repr is
// a shortest round-trip conversion, the costliest part of an optimizer op's
// record (its learning rate, betas, eps), and the same few ints (dimensions,
// flags) come back op after op.  Emptied when full.
struct ReprCache {
  std::unordered_map<uint64_t, PyObject*> texts;  // held

  PyObject* repr(uint64_t bits, PyObject* value) {
    auto found = texts.find(bits);
    if (found != texts.end()) return Ref::borrow(found->second).release();
    PyObject* text = PyObject_Repr(value);
    if (!text) return nullptr;
    if (texts.size() >= REPR_CACHE_SIZE) {
      for (auto& entry : texts) Py_DECREF(entry.second);
      texts.clear();
    }
    texts.emplace(bits, Ref::borrow(text).release());
    return text;
  }
  static const size_t REPR_CACHE_SIZE = 4096;
};
ReprCache float_reprs, int_reprs;

// OpTracer's _plain: a non-tensor argument as text equal across processes.
PyObject* plain(PyObject* value) {
  if (PyFloat_CheckExact(value)) {
    double number = PyFloat_AS_DOUBLE(value);
    uint64_t bits;
    std::memcpy(&bits, &number, sizeof bits);
    return float_reprs.repr(bits, value);
  }
  if (PyLong_CheckExact(value)) {
    int overflow;
    long long number = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (!overflow && !(number == -1 && PyErr_Occurred())) return int_reprs.repr(static_cast<uint64_t>(number), value);
    PyErr_Clear();
    return PyObject_Repr(value);
  }
  if (PyBool_Check(value) || value == Py_None) return PyObject_Repr(value);  // (their reprs are interned)
  int is_plain = PyObject_IsInstance(value, constants.plain_types);
  if (is_plain < 0) return nullptr;
  if (is_plain) return PyObject_Repr(value);
  return PyObject_GetAttr(reinterpret_cast<PyObject*>(Py_TYPE(value)), names.name_attr);
}

// OpTracer._meta and _result_meta
PyObject* meta(Tracer& tracer, PyObject* value) {
  if (!is_tensor(value)) return PyObject_CallOneArg(constants.result_meta, value);
  const at::Tensor& tensor = THPVariable_Unpack(value);
  Ref shape(int_tuple(tensor.sizes()));
  Ref key(shape ? PyTuple_Pack(2, dtype_of(tensor), shape.get()) : nullptr);
  if (!key) return nullptr;
  PyObject* known = PyDict_GetItemWithError(tracer.out_meta, key.get());
  if (known) return Ref::borrow(known).release();
  if (PyErr_Occurred()) return nullptr;
  return PyObject_CallMethodOneArg(tracer.self, names.meta, value);
}

PyObject* pack(const Refs& items) {
  PyObject* tuple = PyTuple_New(items.size());
  if (!tuple) return nullptr;
  for (size_t i = 0; i < items.size(); ++i) PyTuple_SET_ITEM(tuple, i, Ref::borrow(items[i].get()).release());
  return tuple;
}

PyObject* list_of(const Objects& items) {
  PyObject* list = PyList_New(items.size());
  if (!list) return nullptr;
  for (size_t i = 0; i < items.size(); ++i) PyList_SET_ITEM(list, i, Ref::borrow(items[i]).release());
  return list;
}

PyObject* list_of(const Refs& items) {
  PyObject* list = PyList_New(items.size());
  if (!list) return nullptr;
  for (size_t i = 0; i < items.size(); ++i) PyList_SET_ITEM(list, i, Ref::borrow(items[i].get()).release());
  return list;
}

// The out_meta of a one-result op, ("float32[4, 8]",): one tuple per text, shared
// by the records (most ops have one result, of a few shapes).  Emptied when full.
std::unordered_map<PyObject*, PyObject*> single_metas;  // meta text -> its 1-tuple, both held
const size_t SINGLE_META_CACHE_SIZE = 4096;

PyObject* single_meta(PyObject* text) {
  auto found = single_metas.find(text);
  if (found != single_metas.end()) return Ref::borrow(found->second).release();
  PyObject* tuple = untracked(PyTuple_Pack(1, text));
  if (!tuple) return nullptr;
  if (single_metas.size() >= SINGLE_META_CACHE_SIZE) {
    for (auto& entry : single_metas) {
      Py_DECREF(entry.first);
      Py_DECREF(entry.second);
    }
    single_metas.clear();
  }
  Py_INCREF(text);
  single_metas.emplace(text, Ref::borrow(tuple).release());
  return tuple;
}

// Whether OpTracer.record must take this op: what this function does not do.
bool needs_python(const Bound& bound, const Objects& flat_args, Py_ssize_t record_index, bool* answer) {
  *answer = true;
  PyObject* capture_ops = bound.capture_ops.get();
  if (PySet_GET_SIZE(capture_ops) > 0) {
    Ref index(PyLong_FromSsize_t(record_index));
    int captured = index ? PySet_Contains(capture_ops, index.get()) : -1;
    if (captured != 0) return captured > 0;
  }
  if (PyDict_GET_SIZE(bound.pending.get()) > 0) return true;
  for (PyObject* value : flat_args) {
    if (is_tensor(value) && !is_plain_tensor(value)) return true;
  }
  *answer = false;
  return true;
}

// OpTracer.record(func, args, kwargs, caller); caller: the frame that dispatched the op, or null
PyObject* record_op(const Bound& bound, PyObject* func, PyObject* args, PyObject* kwargs, PyObject* caller_frame) {
  PyObject* self = bound.tracer;
  Ref caller = Ref::borrow(caller_frame ? caller_frame : Py_None);
  const OpInfo* found = op_info(self, func);
  if (!found) return nullptr;
  const OpInfo& info = *found;
  if (info.untraced) return PyObject_Call(info.call.get(), args, kwargs);
  if (info.python_only) return PyObject_CallMethodObjArgs(self, names.record, func, args, kwargs, caller.get(), nullptr);

  Tracer tracer(bound);
  if (!tracer.load()) return nullptr;
  Py_ssize_t index = PyList_GET_SIZE(tracer.records);
  Objects flat_args;
  if (info.flat_args) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args); ++i) flat_args.push_back(PyTuple_GET_ITEM(args, i));
    PyObject *key, *value;
    Py_ssize_t position = 0;
    while (PyDict_Next(kwargs, &position, &key, &value)) flat_args.push_back(value);
  } else {
    flatten(args, &flat_args);
    PyObject *key, *value;
    Py_ssize_t position = 0;
    while (PyDict_Next(kwargs, &position, &key, &value)) flatten(value, &flat_args);
  }
  bool to_python;
  if (!needs_python(bound, flat_args, index, &to_python)) return nullptr;
  if (to_python) return PyObject_CallMethodObjArgs(self, names.record, func, args, kwargs, caller.get(), nullptr);

  Ref record_index(PyLong_FromSsize_t(index));
  if (!record_index) return nullptr;
  Ref last_outputs(PyObject_GetAttr(self, names.last_outputs));
  if (!last_outputs || (last_outputs.get() != Py_None && !note_forward_sites(tracer, last_outputs.get())))
    return nullptr;
  Ref site(site_of(tracer, caller_frame));
  if (!site) return nullptr;

  Refs inputs, leaves;
  Objects input_tensors;  // borrowed, in input order
  // the CRC-32 of the non-tensor arguments' texts joined by \x1f, taken piece by piece
  unsigned long args_crc = 0;
  bool any_plain = false;
  PyObject* view_of = nullptr;
  int64_t view_of_id = 0;
  for (PyObject* value : flat_args) {
    if (is_tensor(value)) {
      Ref digest_id, origin;
      if (!input_ref(tracer, value, index, &digest_id, &origin)) return nullptr;
      if (origin) {
        Ref position(PyLong_FromSize_t(inputs.size()));
        Ref leaf(position ? untracked(PyTuple_Pack(3, position.get(), PyTuple_GET_ITEM(origin.get(), 0), PyTuple_GET_ITEM(origin.get(), 1))) : nullptr);
        if (!leaf) return nullptr;
        leaves.push_back(std::move(leaf));
      }
      if (inputs.empty() && info.is_view) {
        view_of = value;
        view_of_id = PyLong_AsLongLong(digest_id.get());
      }
      inputs.push_back(std::move(digest_id));
      input_tensors.push_back(value);
    } else {
      Ref text(plain(value));
      Py_ssize_t size;
      const char* bytes = text ? PyUnicode_AsUTF8AndSize(text.get(), &size) : nullptr;
      if (!bytes || (any_plain && !crc32_update("\x1f", 1, &args_crc)) || !crc32_update(bytes, size, &args_crc))
        return nullptr;
      any_plain = true;
    }
  }
  if (!info.unread_args.empty()) {  // OpTracer's _mark_unread
    Objects unread;
    for (const auto& [position, name] : info.unread_args) {
      PyObject* value = position < PyTuple_GET_SIZE(args) ? PyTuple_GET_ITEM(args, position) : PyDict_GetItem(kwargs, name.get());
      if (value && is_tensor(value)) unread.push_back(value);
    }
    c10::SmallVector<size_t, 8> positions;
    for (size_t i = 0; i < input_tensors.size(); ++i) {
      for (PyObject* value : unread) {
        if (input_tensors[i] == value) {
          positions.push_back(i);
          break;
        }
      }
    }
    for (size_t position : positions) inputs[position] = Ref::borrow(constants.unread);
    Refs kept;
    for (auto& leaf : leaves) {
      size_t position = PyLong_AsSize_t(PyTuple_GET_ITEM(leaf.get(), 0));
      bool dropped = false;
      for (size_t unread_position : positions) dropped = dropped || unread_position == position;
      if (!dropped) kept.push_back(std::move(leaf));
    }
    leaves = std::move(kept);
  }

  Ref observer(PyObject_GetAttr(self, names.observer));
  if (!observer) return nullptr;
  if (observer.get() != Py_None) {
    Ref flat_list(list_of(flat_args)), inputs_list(list_of(inputs)), leaves_list(list_of(leaves));
    if (!flat_list || !inputs_list || !leaves_list) return nullptr;
    Ref told(PyObject_CallMethodObjArgs(observer.get(), names.before_op, record_index.get(), flat_list.get(),
                                        inputs_list.get(), leaves_list.get(), nullptr));
    if (!told) return nullptr;
  }
  if (PyObject_SetAttr(self, names.dispatching, site.get()) < 0) return nullptr;
  Ref result(PyObject_Call(info.call.get(), args, kwargs));
  {
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    int reset = PyObject_SetAttr(self, names.dispatching, Py_None);
    if (type) {
      PyErr_Restore(type, value, traceback);
      return nullptr;
    }
    if (reset < 0) return nullptr;
  }

  if (info.is_allocation) {
    Ref fill(PyObject_GetAttr(self, names.allocation_fill));
    if (!fill) return nullptr;
    if (fill.get() != Py_None) {
      Ref done(PyObject_CallMethodOneArg(self, names.fill_allocation, result.get()));
      if (!done) return nullptr;
    }
  }
  Objects flat_result;  // borrowed from result
  if (info.single_result) {
    flat_result.push_back(result.get());
  } else {
    flatten(result.get(), &flat_result);
  }
  Objects out_tensors, written;
  auto add_output = [&out_tensors](PyObject* value) {
    if (!is_tensor(value)) return;
    for (PyObject* known : out_tensors) {
      if (known == value) return;
    }
    out_tensors.push_back(value);
  };
  for (PyObject* value : flat_result) add_output(value);
  for (const auto& [position, name] : info.written_args) {
    PyObject* value = position < PyTuple_GET_SIZE(args) ? PyTuple_GET_ITEM(args, position) : PyDict_GetItem(kwargs, name.get());
    if (value == nullptr) continue;
    Objects items;
    if (info.flat_args) {
      items.push_back(value);
    } else {  // a written list of tensors (the _foreach_ ops')
      flatten(value, &items);
    }
    for (PyObject* item : items) {
      if (is_tensor(item)) {
        written.push_back(item);
        add_output(item);
      }
    }
  }
  if (PyUnicode_GET_LENGTH(PyTuple_GET_ITEM(site.get(), 1)) > 0 && c10::GradMode::is_enabled()) {
    // weakly: an output this mode still holds when it returns is detached by torch (a factory's)
    Ref references(PyList_New(out_tensors.size()));
    if (!references) return nullptr;
    for (size_t i = 0; i < out_tensors.size(); ++i) {
      PyObject* reference = PyWeakref_NewRef(out_tensors[i], nullptr);
      if (!reference) return nullptr;
      PyList_SET_ITEM(references.get(), i, reference);
    }
    Ref user_site(untracked(PyTuple_GetSlice(site.get(), 1, 4)));
    Ref last(user_site ? PyTuple_Pack(2, references.get(), user_site.get()) : nullptr);
    if (!last || PyObject_SetAttr(self, names.last_outputs, last.get()) < 0) return nullptr;
  }
  Refs outputs;
  for (PyObject* tensor : out_tensors) {
    bool is_written = false;
    for (PyObject* item : written) is_written = is_written || item == tensor;
    Ref digest_id(output_ref(tracer, tensor, info, index, is_written, view_of, view_of_id));
    if (!digest_id) return nullptr;
    if (digest_id.get() != Py_None) outputs.push_back(std::move(digest_id));
  }
  if (info.returns_python) {  // OpTracer._stage_value_digest: a number is exact in its repr
    for (PyObject* value : flat_result) {
      if (value == Py_None || is_tensor(value)) continue;
      Ref text(plain(value));
      Py_ssize_t size;
      const char* bytes = text ? PyUnicode_AsUTF8AndSize(text.get(), &size) : nullptr;
      Ref digest(bytes ? crc32_of(bytes, size) : nullptr);
      Ref digest_id(digest ? PyLong_FromSsize_t(PyList_GET_SIZE(tracer.digests) + PyList_GET_SIZE(tracer.staged)) : nullptr);
      if (!digest_id || PyList_Append(tracer.staged, digest.get()) < 0) return nullptr;
      outputs.push_back(std::move(digest_id));
    }
  }
  Refs out_meta;
  for (PyObject* value : flat_result) {
    Ref text(meta(tracer, value));
    if (!text) return nullptr;
    out_meta.push_back(std::move(text));
  }

  Ref args_digest(PyLong_FromUnsignedLong(args_crc));
  if (!args_digest) return nullptr;
  Ref step;
  if (tracer.watcher.get() == Py_None) {
    step = Ref::borrow(constants.one);
  } else {
    Ref steps(PyObject_GetAttr(tracer.watcher.get(), names.steps));
    step = Ref(steps ? PyNumber_Add(steps.get(), constants.one) : nullptr);
    if (!step) return nullptr;
  }
  // (their items are strings, numbers and untracked leaves)
  Ref out_meta_tuple(out_meta.size() == 1 ? single_meta(out_meta[0].get()) : untracked(pack(out_meta))), inputs_tuple(untracked(pack(inputs))),
      outputs_tuple(untracked(pack(outputs))), leaves_tuple(untracked(pack(leaves)));
  if (!out_meta_tuple || !inputs_tuple || !outputs_tuple || !leaves_tuple) return nullptr;
  PyObject* site_items = site.get();
  Ref entry(untracked(PyTuple_Pack(12, info.name.get(), PyTuple_GET_ITEM(site_items, 0), PyTuple_GET_ITEM(site_items, 1),
                         PyTuple_GET_ITEM(site_items, 2), PyTuple_GET_ITEM(site_items, 3), step.get(),
                         out_meta_tuple.get(), args_digest.get(), inputs_tuple.get(), outputs_tuple.get(),
                         leaves_tuple.get(), info.is_seeded ? Py_True : Py_False)));
  if (!entry || PyList_Append(tracer.records, entry.get()) < 0) return nullptr;
  if (observer.get() != Py_None) {
    Ref outputs_list(list_of(out_tensors)), results_list(list_of(flat_result));
    if (!outputs_list || !results_list) return nullptr;
    Ref told(PyObject_CallMethodObjArgs(observer.get(), names.after_op, record_index.get(), outputs_list.get(),
                                        results_list.get(), nullptr));
    if (!told) return nullptr;
  }
  if (PyList_GET_SIZE(tracer.staged) >= constants.stage_limit) {
    Ref flushed(PyObject_CallMethodNoArgs(self, names.flush));
    if (!flushed) return nullptr;
  }
  return result.release();
}

// The tracer's mode's __torch_dispatch__ (torch wants a method of the mode):
// dispatch(mode, func, types, args=(), kwargs=None), the tracer's state being
// what bind() made of it, mode._native_state.  A C++ exception
// (c10::Error from a tensor accessor) is raised as Python's RuntimeError.
PyObject* dispatch(PyObject*, PyObject* const* argv, Py_ssize_t argc) {
  if (argc < 3 || argc > 5) {
    PyErr_SetString(PyExc_TypeError, "dispatch(mode, func, types, args=(), kwargs=None)");
    return nullptr;
  }
  Ref capsule(PyObject_GetAttr(argv[0], names.bound));
  const Bound* bound = capsule ? static_cast<const Bound*>(PyCapsule_GetPointer(capsule.get(), BOUND_NAME)) : nullptr;
  if (!bound) return nullptr;
  PyObject *self = bound->tracer, *func = argv[1];
  Ref args = Ref::borrow(argc > 3 ? argv[3] : nullptr);
  if (!args) args = Ref(PyTuple_New(0));
  Ref kwargs = Ref::borrow(argc > 4 && argv[4] != Py_None ? argv[4] : nullptr);
  if (!kwargs) kwargs = Ref(PyDict_New());
  if (!args || !kwargs) return nullptr;
  bool paused = false;
  if (!truthy_attr(self, names.paused, &paused)) return nullptr;
  if (paused) return PyObject_Call(func, args.get(), kwargs.get());
  try {
    // no Python frame of the mode's own lies between: the current frame dispatched the op
    return record_op(*bound, func, args.get(), kwargs.get(), reinterpret_cast<PyObject*>(PyEval_GetFrame()));
  } catch (const std::exception& error) {
    PyErr_SetString(PyExc_RuntimeError, error.what());
    return nullptr;
  }
}


// native_record.StorageTables: storage_tables.StorageTables' methods, for the Python recorder.
TablesObject* as_tables(PyObject* self) { return reinterpret_cast<TablesObject*>(self); }

// The argument at position as a tensor, or null with TypeError set.
const at::Tensor* tensor_argument(PyObject* const* argv, Py_ssize_t argc, Py_ssize_t position) {
  if (position >= argc || !THPVariable_Check(argv[position])) {
    PyErr_SetString(PyExc_TypeError, "StorageTables: a tensor argument is missing");
    return nullptr;
  }
  return &THPVariable_Unpack(argv[position]);
}

// The argument at position as an int64, or false with an error set.
bool int_argument(PyObject* const* argv, Py_ssize_t argc, Py_ssize_t position, int64_t* value) {
  if (position >= argc) {
    PyErr_SetString(PyExc_TypeError, "StorageTables: an int argument is missing");
    return false;
  }
  *value = PyLong_AsLongLong(argv[position]);
  return !(*value == -1 && PyErr_Occurred());
}

// Calls body(), raising a C++ exception (a c10::Error from a tensor accessor) as RuntimeError.
template <typename Body>
PyObject* guarded(Body body) {
  try {
    return body();
  } catch (const std::exception& error) {
    PyErr_SetString(PyExc_RuntimeError, error.what());
    return nullptr;
  }
}

PyObject* tables_has_storage(PyObject*, PyObject* tensor) {
  if (!THPVariable_Check(tensor)) return PyErr_Format(PyExc_TypeError, "StorageTables.has_storage: not a tensor");
  return PyBool_FromLong(storage_of(THPVariable_Unpack(tensor)) != nullptr);
}

PyObject* tables_known(PyObject* self, PyObject* tensor) {
  if (!THPVariable_Check(tensor)) return PyErr_Format(PyExc_TypeError, "StorageTables.known: not a tensor");
  return guarded([&]() -> PyObject* {
    int64_t digest_id;
    if (as_tables(self)->tables->known(THPVariable_Unpack(tensor), &digest_id)) return PyLong_FromLongLong(digest_id);
    Py_RETURN_NONE;
  });
}

PyObject* tables_origin(PyObject* self, PyObject* const* argv, Py_ssize_t argc) {
  const at::Tensor* tensor = tensor_argument(argv, argc, 0);
  int64_t record_index;
  if (!tensor || !int_argument(argv, argc, 1, &record_index)) return nullptr;
  return guarded([&] { return origin_tuple(as_tables(self)->tables->origin(*tensor, record_index)); });
}

PyObject* tables_allocated(PyObject* self, PyObject* const* argv, Py_ssize_t argc) {
  const at::Tensor* tensor = tensor_argument(argv, argc, 0);
  int64_t record_index;
  if (!tensor || !int_argument(argv, argc, 1, &record_index)) return nullptr;
  return guarded([&] {
    as_tables(self)->tables->allocated(*tensor, record_index);
    Py_RETURN_NONE;
  });
}

PyObject* tables_produced(PyObject* self, PyObject* const* argv, Py_ssize_t argc) {
  const at::Tensor* tensor = tensor_argument(argv, argc, 0);
  int64_t record_index;
  if (!tensor || !int_argument(argv, argc, 1, &record_index)) return nullptr;
  int written = argc > 2 ? PyObject_IsTrue(argv[2]) : 0;
  if (written < 0) return nullptr;
  return guarded([&] {
    as_tables(self)->tables->produced(*tensor, record_index, written);
    Py_RETURN_NONE;
  });
}

PyObject* tables_remember(PyObject* self, PyObject* const* argv, Py_ssize_t argc) {
  const at::Tensor* tensor = tensor_argument(argv, argc, 0);
  int64_t version, digest_id;
  if (!tensor || !int_argument(argv, argc, 1, &version) || !int_argument(argv, argc, 2, &digest_id)) return nullptr;
  int written = argc > 3 ? PyObject_IsTrue(argv[3]) : 0;
  if (written < 0) return nullptr;
  return guarded([&] {
    as_tables(self)->tables->remember(*tensor, version, digest_id, written);
    Py_RETURN_NONE;
  });
}

PyObject* tables_forget_digests(PyObject* self, PyObject* tensors) {
  Ref sequence(PySequence_Fast(tensors, "StorageTables.forget_digests: not a sequence"));
  if (!sequence) return nullptr;
  std::vector<at::Tensor> unpacked;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(sequence.get()); ++i) {
    PyObject* item = PySequence_Fast_GET_ITEM(sequence.get(), i);
    if (!THPVariable_Check(item)) return PyErr_Format(PyExc_TypeError, "StorageTables.forget_digests: not a tensor");
    unpacked.push_back(THPVariable_Unpack(item));
  }
  return guarded([&] {
    as_tables(self)->tables->forget_digests(unpacked);
    Py_RETURN_NONE;
  });
}

Py_ssize_t tables_length(PyObject* self) { return static_cast<Py_ssize_t>(as_tables(self)->tables->size()); }

PyObject* tables_new(PyTypeObject* type, PyObject*, PyObject*) {
  Ref self(type->tp_alloc(type, 0));
  if (!self) return nullptr;
  as_tables(self.get())->tables = new StorageTables();
  return self.release();
}

void tables_dealloc(PyObject* self) {
  delete as_tables(self)->tables;
  PyTypeObject* type = Py_TYPE(self);
  type->tp_free(self);
  Py_DECREF(type);
}

template <typename Function>
PyCFunction fastcall(Function function) {
  return reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(function));
}

PyMethodDef tables_methods[] = {
    {"has_storage", tables_has_storage, METH_O, "has_storage(tensor)"},
    {"known", tables_known, METH_O, "known(tensor): the digest id of its bytes at its version, or None"},
    {"origin", fastcall(tables_origin), METH_FASTCALL, "origin(tensor, record_index): (kind, record index)"},
    {"allocated", fastcall(tables_allocated), METH_FASTCALL, "allocated(tensor, record_index)"},
    {"produced", fastcall(tables_produced), METH_FASTCALL, "produced(tensor, record_index, written)"},
    {"remember", fastcall(tables_remember), METH_FASTCALL, "remember(tensor, version, digest_id, written=False)"},
    {"forget_digests", tables_forget_digests, METH_O, "forget_digests(tensors): every digest of their storages"},
    {nullptr, nullptr, 0, nullptr}};

PyType_Slot tables_slots[] = {
    {Py_tp_new, reinterpret_cast<void*>(tables_new)},
    {Py_tp_dealloc, reinterpret_cast<void*>(tables_dealloc)},
    {Py_tp_methods, tables_methods},
    {Py_sq_length, reinterpret_cast<void*>(tables_length)},
    {Py_tp_doc, const_cast<char*>("storage_tables.StorageTables, compiled")},
    {0, nullptr}};

PyType_Spec tables_spec = {"native_record.StorageTables", sizeof(TablesObject), 0, Py_TPFLAGS_DEFAULT, tables_slots};

PyObject* intern(const char* text) { return PyUnicode_InternFromString(text); }

void free_bound(PyObject* capsule) { delete static_cast<Bound*>(PyCapsule_GetPointer(capsule, BOUND_NAME)); }

// bind(tracer): what dispatch() keeps of a tracer, for its mode to hold as _native_state.
PyObject* bind(PyObject*, PyObject* tracer) {
  auto bound = std::make_unique<Bound>();
  bound->tracer = tracer;
  bound->records = Ref(PyObject_GetAttr(tracer, names.records));
  bound->staged = Ref(PyObject_GetAttr(tracer, names.staged));
  bound->tables = Ref(PyObject_GetAttr(tracer, names.tables));
  bound->digests = Ref(PyObject_GetAttr(tracer, names.digests));
  bound->forward_sites = Ref(PyObject_GetAttr(tracer, names.forward_sites));
  bound->out_meta = Ref(PyObject_GetAttr(tracer, names.out_meta));
  bound->capture_ops = Ref(PyObject_GetAttr(tracer, names.capture_ops));
  Ref communications(PyObject_GetAttr(tracer, names.communications));
  bound->pending = Ref(communications ? PyObject_GetAttr(communications.get(), names.pending) : nullptr);
  bound->user_frames = Ref(PyObject_GetAttr(tracer, names.user_frames));
  if (!bound->records || !bound->digests || !bound->forward_sites || !bound->out_meta || !bound->capture_ops ||
      !bound->pending || !bound->user_frames || !bound->staged || !bound->tables ||
      !truthy_attr(tracer, names.host_digests, &bound->host_digests))
    return nullptr;
  if (!PyList_CheckExact(bound->records.get()) || !PyList_CheckExact(bound->digests.get()) ||
      !PyDict_CheckExact(bound->forward_sites.get()) || !PyDict_CheckExact(bound->out_meta.get()) ||
      !PyAnySet_CheckExact(bound->capture_ops.get()) || !PyList_CheckExact(bound->staged.get()) ||
      !PyDict_CheckExact(bound->pending.get()) || Py_TYPE(bound->tables.get()) != tables_type) {
    PyErr_SetString(PyExc_TypeError, "native_record.bind: not an OpTracer");
    return nullptr;
  }
  // The trace and its digests grow by an item or more per op and hold only
  // numbers, strings and tuples of them (OpTracer.record builds them so):
  // they can never be part of a cycle, and a full collection that walked
  // them would cost time in proportion to the trace, again and again.
  PyObject_GC_UnTrack(bound->records.get());
  PyObject_GC_UnTrack(bound->digests.get());
  PyObject* capsule = PyCapsule_New(bound.get(), BOUND_NAME, free_bound);
  if (capsule) bound.release();
  return capsule;
}

// configure(constants: dict): tracer.py's constants and helpers, once per process.
PyObject* configure(PyObject*, PyObject* given) {
  auto item = [given](const char* key) -> PyObject* {
    PyObject* value = PyDict_GetItemString(given, key);
    if (!value) {
      PyErr_Format(PyExc_KeyError, "native_record.configure: %s", key);
      return nullptr;
    }
    Py_INCREF(value);
    return value;
  };
  Constants c;
  if (!(c.plain_types = item("plain_types")) || !(c.parameter_type = item("parameter_type")) ||
      !(c.crc32 = item("crc32")) || !(c.result_meta = item("result_meta")) ||
      !(c.user_files = item("user_files")) || !(c.is_user_file = item("is_user_file")) || !(c.forward = item("forward")) ||
      !(c.backward = item("backward")) || !(c.optimizer = item("optimizer")) || !(c.setup = item("setup")) || !(c.produced = item("produced")) ||
      !(c.allocated = item("allocated")) || !(c.external = item("external")) || !(c.uninit = item("uninit")) ||
      !(c.unread = item("unread")))
    return nullptr;
  Ref crc_max(item("crc_max_bytes")), stage_limit(item("stage_limit")), resumable(item("resumable_code")),
      min_forget_at(item("min_forget_at")), weight_multiplier(item("weight_multiplier")),
      chunk_words(item("chunk_words")), chunk_multiplier(item("chunk_multiplier"));
  if (!crc_max || !stage_limit || !resumable || !min_forget_at || !weight_multiplier || !chunk_words || !chunk_multiplier)
    return nullptr;
  c.min_forget_at = PyLong_AsSize_t(min_forget_at.get());
  c.weight_multiplier = PyLong_AsUnsignedLongLongMask(weight_multiplier.get());
  c.chunk_multiplier = PyLong_AsUnsignedLongLongMask(chunk_multiplier.get());
  c.chunk_words = PyLong_AsLongLong(chunk_words.get());
  c.uninit_id = PyLong_AsLongLong(c.uninit);
  c.resumable_code = PyLong_AsLong(resumable.get());
  c.crc_max_bytes = PyLong_AsSsize_t(crc_max.get());
  c.stage_limit = PyLong_AsSsize_t(stage_limit.get());
  c.empty_str = intern("");
  c.zero = PyLong_FromLong(0);
  c.one = PyLong_FromLong(1);
  constants = c;
  op_infos.clear();
  zlib_crc32 = find_zlib_crc32();
  Py_RETURN_NONE;
}

// digests.host_digest's weighted sum of one chunk of 64-bit words: the sum of word[i] * (i * multiplier | 1),
// modulo 2**64.  Integer arithmetic, so any order of summing gives the same digest; AVX-512 takes eight
// words an instruction where the CPU has it (about 4x numpy.dot's speed), and the portable loop the rest.
// Written with intrinsics, and the portable loop kept from the auto-vectorizer: GCC 12 vectorizing this
// loop for AVX2 (-O3) gave another sum, and a digest that depends on the compiler is no digest.
__attribute__((optimize("no-tree-vectorize")))
uint64_t weighted_words_portable(const unsigned char* bytes, int64_t begin, int64_t end, uint64_t multiplier) {
  const int LANES = 4;  // independent sums: not one long dependency chain
  uint64_t lanes[LANES] = {0, 0, 0, 0}, positions[LANES];
  for (int lane = 0; lane < LANES; ++lane) positions[lane] = static_cast<uint64_t>(begin + lane) * multiplier;
  const uint64_t step = LANES * multiplier;
  int64_t i = begin;
  for (; i + LANES <= end; i += LANES) {
    for (int lane = 0; lane < LANES; ++lane) {
      uint64_t word;
      std::memcpy(&word, bytes + 8 * (i + lane), 8);  // (a numpy view need not be aligned)
      lanes[lane] += word * (positions[lane] | 1);
      positions[lane] += step;
    }
  }
  uint64_t sum = lanes[0] + lanes[1] + lanes[2] + lanes[3];
  for (; i < end; ++i) {
    uint64_t word;
    std::memcpy(&word, bytes + 8 * i, 8);
    sum += word * ((static_cast<uint64_t>(i) * multiplier) | 1);
  }
  return sum;
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f,avx512dq")))
uint64_t weighted_words_avx512(const unsigned char* bytes, int64_t count, uint64_t multiplier) {
  alignas(64) uint64_t first[16];
  for (int lane = 0; lane < 16; ++lane) first[lane] = static_cast<uint64_t>(lane) * multiplier;
  __m512i low = _mm512_load_si512(first), high = _mm512_load_si512(first + 8);  // words i..i+7, i+8..i+15
  const __m512i step = _mm512_set1_epi64(static_cast<long long>(16 * multiplier)), one = _mm512_set1_epi64(1);
  __m512i sum_low = _mm512_setzero_si512(), sum_high = _mm512_setzero_si512();
  int64_t i = 0;
  for (; i + 16 <= count; i += 16) {
    __m512i words_low = _mm512_loadu_si512(bytes + 8 * i), words_high = _mm512_loadu_si512(bytes + 8 * (i + 8));
    sum_low = _mm512_add_epi64(sum_low, _mm512_mullo_epi64(words_low, _mm512_or_si512(low, one)));
    sum_high = _mm512_add_epi64(sum_high, _mm512_mullo_epi64(words_high, _mm512_or_si512(high, one)));
    low = _mm512_add_epi64(low, step);
    high = _mm512_add_epi64(high, step);
  }
  uint64_t sum = static_cast<uint64_t>(_mm512_reduce_add_epi64(_mm512_add_epi64(sum_low, sum_high)));
  return sum + weighted_words_portable(bytes, i, count, multiplier);
}

// (a static initializer may run before libgcc's own constructor has read the CPU: __builtin_cpu_init first)
const bool HAS_AVX512 = (__builtin_cpu_init(), __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq"));
#endif

uint64_t weighted_words(const unsigned char* bytes, int64_t count, uint64_t multiplier) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (HAS_AVX512) return weighted_words_avx512(bytes, count, multiplier);
#endif
  return weighted_words_portable(bytes, 0, count, multiplier);
}

// digests.host_digest's sum over the chunks of a contiguous CPU tensor's 64-bit words: for each
// chunk, digest := digest * chunk_multiplier + its weighted sum, from `digest` (the CRC-32 of the
// last 0-7 bytes).
uint64_t chunked_words_digest(const unsigned char* bytes, int64_t words, uint64_t digest, uint64_t multiplier,
                              int64_t chunk_words, uint64_t chunk_multiplier, bool portable) {
  for (int64_t start = 0; start < words; start += chunk_words) {
    int64_t count = std::min(chunk_words, words - start);
    const unsigned char* chunk = bytes + 8 * start;
    digest = digest * chunk_multiplier +
             (portable ? weighted_words_portable(chunk, 0, count, multiplier) : weighted_words(chunk, count, multiplier));
  }
  return digest;
}

// words_digest(address, words, digest, multiplier, chunk_words, chunk_multiplier, portable=False):
// chunked_words_digest for digests.host_digest; portable: without AVX-512 (for tests).
PyObject* words_digest(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 6 && nargs != 7) return PyErr_Format(PyExc_TypeError, "words_digest: 6 or 7 arguments, %zd given", nargs);
  const auto* bytes = static_cast<const unsigned char*>(PyLong_AsVoidPtr(args[0]));
  int64_t words = PyLong_AsLongLong(args[1]);
  uint64_t digest = PyLong_AsUnsignedLongLongMask(args[2]);
  uint64_t multiplier = PyLong_AsUnsignedLongLongMask(args[3]);
  int64_t chunk_words = PyLong_AsLongLong(args[4]);
  uint64_t chunk_multiplier = PyLong_AsUnsignedLongLongMask(args[5]);
  int portable = nargs == 7 ? PyObject_IsTrue(args[6]) : 0;
  if (PyErr_Occurred()) return nullptr;
  if (chunk_words <= 0 || words < 0) return PyErr_Format(PyExc_ValueError, "words_digest: a negative or empty size");
  return PyLong_FromUnsignedLongLong(
      chunked_words_digest(bytes, words, digest, multiplier, chunk_words, chunk_multiplier, portable));
}

PyMethodDef methods[] = {
    {"words_digest", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(words_digest)), METH_FASTCALL,
     "words_digest(address, words, digest, multiplier, chunk_words, chunk_multiplier, portable=False): "
     "digests.host_digest's sum over the chunks of a contiguous tensor's words"},
    {"dispatch", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(dispatch)), METH_FASTCALL,
     "dispatch(mode, func, types, args=(), kwargs=None): the tracer's __torch_dispatch__, compiled"},
    {"bind", bind, METH_O, "bind(tracer): the tracer's state for dispatch(), held by its mode as _native_state"},
    {"configure", configure, METH_O, "configure(constants): tracer.py's constants, once per process"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "native_record", nullptr, -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit_native_record() {
  // the attribute names record() reads, interned once
  names.records = intern("records");
  names.digests = intern("digests");
  names.staged = intern("_staged");
  names.tables = intern("tables");
  names.forward_sites = intern("_forward_sites");
  names.last_outputs = intern("_last_outputs");
  names.user_frames = intern("_user_frames");
  names.watcher = intern("watcher");
  names.observer = intern("observer");
  names.capture_ops = intern("capture_ops");
  names.communications = intern("communications");
  names.pending = intern("pending");
  names.allocation_fill = intern("allocation_fill");
  names.host_digests = intern("_host_digests");
  names.out_meta = intern("_out_meta");
  names.dispatching = intern("dispatching");
  names.in_optimizer = intern("in_optimizer");
  names.training_started = intern("training_started");
  names.module_stack = intern("_module_stack");
  names.steps = intern("steps");
  names.caller = intern("caller");
  names.user = intern("user");
  names.record = intern("record");
  names.paused = intern("paused");
  names.bound = intern("_native_state");
  names.before_op = intern("before_op");
  names.after_op = intern("after_op");
  names.info = intern("_info");
  names.stage_digest = intern("_stage_digest");
  names.fill_allocation = intern("_fill_allocation");
  names.meta = intern("_meta");
  names.flush = intern("flush");
  names.name = intern("name");
  names.call = intern("call");
  names.is_allocation = intern("is_allocation");
  names.is_seeded = intern("is_seeded");
  names.is_view = intern("is_view");
  names.flat_args = intern("flat_args");
  names.single_result = intern("single_result");
  names.untraced = intern("untraced");
  names.python_only = intern("python_only");
  names.returns_python = intern("returns_python");
  names.written_args = intern("written_args");
  names.unread_args = intern("unread_args");
  names.name_attr = intern("__name__");
  Ref created(PyModule_Create(&module));
  tables_type = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&tables_spec));
  if (!created || !tables_type) return nullptr;
  Py_INCREF(tables_type);  // (the module keeps one reference, this file the other)
  if (PyModule_AddObject(created.get(), "StorageTables", reinterpret_cast<PyObject*>(tables_type)) < 0) return nullptr;
  return created.release();
}
