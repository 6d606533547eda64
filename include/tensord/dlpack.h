/*
 * DLPack ABI, written for tensord. ABI-identical to DLPack 1.3: the same
 * structs, field order, enum values and flag bits, so a DLManagedTensor or
 * DLManagedTensorVersioned made here can be handed to any DLPack consumer
 * and the other way round. Only the names in this file are DLPack's; the
 * text is our own.
 */
#ifndef TENSORD_DLPACK_H
#define TENSORD_DLPACK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#define DLPACK_EXTERN_C extern "C"
#else
#define DLPACK_EXTERN_C
#endif

#ifndef DLPACK_DLL
#define DLPACK_DLL
#endif

#define DLPACK_MAJOR_VERSION 1
#define DLPACK_MINOR_VERSION 3

/* Bits of DLManagedTensorVersioned.flags. */
#define DLPACK_FLAG_BITMASK_READ_ONLY (1UL << 0UL)
#define DLPACK_FLAG_BITMASK_IS_COPIED (1UL << 1UL)
#define DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED (1UL << 2UL)

#ifdef __cplusplus
extern "C" {
#endif

/* The version of the ABI a DLManagedTensorVersioned was made for. A consumer
 * that sees another major version may only call the deleter. */
typedef struct {
	uint32_t major;
	uint32_t minor;
} DLPackVersion;

#ifdef __cplusplus
typedef enum : int32_t {
#else
typedef enum {
#endif
	kDLCPU = 1,
	kDLCUDA = 2,
	kDLCUDAHost = 3,
	kDLOpenCL = 4,
	kDLVulkan = 7,
	kDLMetal = 8,
	kDLVPI = 9,
	kDLROCM = 10,
	kDLROCMHost = 11,
	kDLExtDev = 12,
	kDLCUDAManaged = 13,
	kDLOneAPI = 14,
	kDLWebGPU = 15,
	kDLHexagon = 16,
	kDLMAIA = 17,
	kDLTrn = 18,
} DLDeviceType;

/* Where the data lives. device_id is 0 for plain CPU memory. */
typedef struct {
	DLDeviceType device_type;
	int32_t device_id;
} DLDevice;

typedef enum {
	kDLInt = 0U,
	kDLUInt = 1U,
	kDLFloat = 2U,
	kDLOpaqueHandle = 3U,
	kDLBfloat = 4U,
	kDLComplex = 5U,
	kDLBool = 6U,
	kDLFloat8_e3m4 = 7U,
	kDLFloat8_e4m3 = 8U,
	kDLFloat8_e4m3b11fnuz = 9U,
	kDLFloat8_e4m3fn = 10U,
	kDLFloat8_e4m3fnuz = 11U,
	kDLFloat8_e5m2 = 12U,
	kDLFloat8_e5m2fnuz = 13U,
	kDLFloat8_e8m0fnu = 14U,
	kDLFloat6_e2m3fn = 15U,
	kDLFloat6_e3m2fn = 16U,
	kDLFloat4_e2m1fn = 17U,
} DLDataTypeCode;

/* An element type: code is a DLDataTypeCode, bits the width of one lane
 * (complex: both halves together), lanes the vector width (1 for scalars). */
typedef struct {
	uint8_t code;
	uint8_t bits;
	uint16_t lanes;
} DLDataType;

/* A borrowed view of an n-dimensional array. Shape and strides are in
 * elements; strides is non-NULL whenever ndim != 0 (DLPack >= 1.2). The first
 * element is at (char *)data + byte_offset. */
typedef struct {
	void *data;
	DLDevice device;
	int32_t ndim;
	DLDataType dtype;
	int64_t *shape;
	int64_t *strides;
	uint64_t byte_offset;
} DLTensor;

/* The pre-1.0 owning wrapper. deleter(self) frees everything, self included;
 * it may be NULL when the producer has nothing to free. */
typedef struct DLManagedTensor {
	DLTensor dl_tensor;
	void *manager_ctx;
	void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

/* The 1.x owning wrapper. Everything up to and including flags keeps its
 * place in every future version, so a deleter can always be found. */
typedef struct DLManagedTensorVersioned {
	DLPackVersion version;
	void *manager_ctx;
	void (*deleter)(struct DLManagedTensorVersioned *self);
	uint64_t flags;
	DLTensor dl_tensor;
} DLManagedTensorVersioned;

/* The C exchange table of DLPack 1.2/1.3: lets C consumers turn Python
 * objects into tensors without Python-level calls. Functions return 0 on
 * success and -1 with a Python exception set. None of them synchronizes
 * streams. */
typedef int (*DLPackManagedTensorAllocator)(DLTensor *prototype, DLManagedTensorVersioned **out,
					     void *error_ctx,
					     void (*SetError)(void *error_ctx, const char *kind,
							      const char *message));
typedef int (*DLPackManagedTensorFromPyObjectNoSync)(void *py_object,
						     DLManagedTensorVersioned **out);
typedef int (*DLPackManagedTensorToPyObjectNoSync)(DLManagedTensorVersioned *tensor,
						   void **out_py_object);
typedef int (*DLPackDLTensorFromPyObjectNoSync)(void *py_object, DLTensor *out);
typedef int (*DLPackCurrentWorkStream)(DLDeviceType device_type, int32_t device_id,
				       void **out_current_stream);

typedef struct DLPackExchangeAPIHeader {
	DLPackVersion version;
	struct DLPackExchangeAPIHeader *prev_api;
} DLPackExchangeAPIHeader;

typedef struct DLPackExchangeAPI {
	DLPackExchangeAPIHeader header;
	DLPackManagedTensorAllocator managed_tensor_allocator;
	DLPackManagedTensorFromPyObjectNoSync managed_tensor_from_py_object_no_sync;
	DLPackManagedTensorToPyObjectNoSync managed_tensor_to_py_object_no_sync;
	DLPackDLTensorFromPyObjectNoSync dltensor_from_py_object_no_sync;
	DLPackCurrentWorkStream current_work_stream;
} DLPackExchangeAPI;

#ifdef __cplusplus
}
#endif

#endif /* TENSORD_DLPACK_H */
