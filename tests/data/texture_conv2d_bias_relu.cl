// Function: fused_conv2d_NCHWc_OIHWo1_add1_relu1_kernel
#ifdef __OPENCL_VERSION__
#if __OPENCL_VERSION__ == CL_VERSION_2_0 || __OPENCL_VERSION__ == CL_VERSION_3_0 
#define READ_IMAGEH(image, sampler, coord) read_imageh(image, sampler, coord)
#define READ_IMAGEF(image, sampler, coord) read_imagef(image, sampler, coord)
#else
#define READ_IMAGEH(image, sampler, coord) read_imageh(image, coord)
#define READ_IMAGEF(image, sampler, coord) read_imagef(image, coord)
#endif
#endif

__kernel void fused_conv2d_NCHWc_OIHWo1_add1_relu1_kernel(__global float* restrict compute_intermediate_ptr, __read_only image2d_array_t lv3_4c_ptr, __global float* restrict param_0_ptr, __global float* restrict param_1_ptr);
__kernel void fused_conv2d_NCHWc_OIHWo_add_relu_kernel(__write_only image2d_array_t compute_intermediate_ptr, __global float* restrict param_0_ptr, __global float* restrict param_1_ptr, __read_only image2d_array_t x_4c_ptr);
__kernel void te_layout_transform_kernel(__write_only image2d_array_t te_layout_transform_ptr, __global float* restrict x_ptr);
__kernel void te_layout_transform1_kernel(__global float* restrict gv_4c_ptr, __global float* restrict te_layout_transform_ptr);
__kernel void fused_conv2d_NCHWc_OIHWo1_add1_relu1_kernel(__global float* restrict compute_intermediate_ptr, __read_only image2d_array_t lv3_4c_ptr, __global float* restrict param_0_ptr, __global float* restrict param_1_ptr) {
  const sampler_t image_sampler = CLK_NORMALIZED_COORDS_FALSE | CLK_ADDRESS_CLAMP | CLK_FILTER_NEAREST;
  float conv2d_NCHWc_OIHWo_intermediate_local_ptr[32];
  float conv2d_data_pad_local_ptr[4];
  if (((bool)((convert_int(get_local_id(1))) < 14)) && ((bool)((convert_int(get_local_id(0))) < 14))) {
    vstore4(((float4)(0.000000e+00f, 0.000000e+00f, 0.000000e+00f, 0.000000e+00f)), 0, conv2d_NCHWc_OIHWo_intermediate_local_ptr + 0);
  }
  if (((bool)((convert_int(get_local_id(1))) < 14)) && ((bool)((convert_int(get_local_id(0))) < 14))) {
    vstore4(((float4)(0.000000e+00f, 0.000000e+00f, 0.000000e+00f, 0.000000e+00f)), 0, conv2d_NCHWc_OIHWo_intermediate_local_ptr + 4);
  }
  int cse_v2 = ((convert_int(get_local_id(1))) * 56);
  for (int ic_0 = 0; ic_0 < 4; ++ic_0) {
    for (int kh = 0; kh < 3; ++kh) {
      for (int kw = 0; kw < 3; ++kw) {
        if (((bool)(((kh >> 1) + (convert_int(get_local_id(1)))) < 15)) && ((bool)(((kw >> 1) + (convert_int(get_local_id(0)))) < 15))) {
          int cse_v1 = ((convert_int(get_local_id(0))) * 2);
          int cse_v4 = (((convert_int(get_local_id(1))) * 2) + kh);
          int cse_v5 = (((convert_int(get_local_id(0))) * 2) + kw);
          float4 condval;
          if (((bool)(((bool)(((bool)(1 <= (((convert_int(get_local_id(1))) * 2) + kh))) && ((bool)((((convert_int(get_local_id(1))) * 2) + kh) < 29)))) && ((bool)(1 <= (((convert_int(get_local_id(0))) * 2) + kw))))) && ((bool)((((convert_int(get_local_id(0))) * 2) + kw) < 29))) {
            float4 v_ = as_float4(READ_IMAGEF(lv3_4c_ptr, image_sampler, ((int4)(((((((ic_0 * 784) + ((convert_int(get_local_id(1))) * 56)) + (kh * 28)) + ((convert_int(get_local_id(0))) * 2)) + kw) - 29), 0, 0, 0))));
            condval = v_;
          } else {
            condval = ((float4)(0.000000e+00f, 0.000000e+00f, 0.000000e+00f, 0.000000e+00f));
          }
          vstore4(condval, 0, conv2d_data_pad_local_ptr + 0);
        }
        for (int ic_1 = 0; ic_1 < 4; ++ic_1) {
          for (int i4 = 0; i4 < 4; ++i4) {
            int cse_v7 = (((((ic_0 * 144) + (ic_1 * 36)) + (kh * 12)) + (kw * 4)) + i4);
            if (((bool)((convert_int(get_local_id(1))) < 14)) && ((bool)((convert_int(get_local_id(0))) < 14))) {
              conv2d_NCHWc_OIHWo_intermediate_local_ptr[i4] = (conv2d_NCHWc_OIHWo_intermediate_local_ptr[i4] + (conv2d_data_pad_local_ptr[ic_1] * param_0_ptr[(((((ic_0 * 144) + (ic_1 * 36)) + (kh * 12)) + (kw * 4)) + i4)]));
            }
            if (((bool)((convert_int(get_local_id(1))) < 14)) && ((bool)((convert_int(get_local_id(0))) < 14))) {
              int cse_v3 = (i4 + 4);
              conv2d_NCHWc_OIHWo_intermediate_local_ptr[(i4 + 4)] = (conv2d_NCHWc_OIHWo_intermediate_local_ptr[(i4 + 4)] + (conv2d_data_pad_local_ptr[ic_1] * param_0_ptr[((((((ic_0 * 144) + (ic_1 * 36)) + (kh * 12)) + (kw * 4)) + i4) + 576)]));
            }
          }
        }
      }
    }
  }
  int cse_v6 = (((convert_int(get_local_id(1))) * 56) + ((convert_int(get_local_id(0))) * 4));
  if (((bool)((convert_int(get_local_id(1))) < 14)) && ((bool)((convert_int(get_local_id(0))) < 14))) {
    vstore4(max((vload4(0, conv2d_NCHWc_OIHWo_intermediate_local_ptr + 0) + vload4(0, param_1_ptr + 0)), ((float4)(0.000000e+00f, 0.000000e+00f, 0.000000e+00f, 0.000000e+00f))), 0, compute_intermediate_ptr + (((convert_int(get_local_id(1))) * 56) + ((convert_int(get_local_id(0))) * 4)));
  }
  if (((bool)((convert_int(get_local_id(1))) < 14)) && ((bool)((convert_int(get_local_id(0))) < 14))) {
    vstore4(max((vload4(0, conv2d_NCHWc_OIHWo_intermediate_local_ptr + 4) + vload4(0, param_1_ptr + 4)), ((float4)(0.000000e+00f, 0.000000e+00f, 0.000000e+00f, 0.000000e+00f))), 0, compute_intermediate_ptr + ((((convert_int(get_local_id(1))) * 56) + ((convert_int(get_local_id(0))) * 4)) + 784));
  }
}

// Function: fused_conv2d_NCHWc_OIHWo_add_relu_kernel
#ifdef __OPENCL_VERSION__
#if __OPENCL_VERSION__ == CL_VERSION_2_0 || __OPENCL_VERSION__ == CL_VERSION_3_0 
#define READ_IMAGEH(image, sampler, coord) read_imageh(image, sampler, coord)
#define READ_IMAGEF(image, sampler, coord) read_imagef(image, sampler, coord)
#else
#define READ_IMAGEH(image, sampler, coord) read_imageh(image, coord)
#define READ_IMAGEF(image, sampler, coord) read_imagef(image, coord)
#endif
#endif

__kernel void fused_conv2d_NCHWc_OIHWo1_add1_relu1_kernel(__global float* restrict compute_intermediate_ptr, __read_only image2d_array_t lv3_4c_ptr, __global float* restrict param_0_ptr, __global float* restrict param_1_ptr);
__kernel void fused_conv2d_NCHWc_OIHWo_add_relu_kernel(__write_only image2d_array_t compute_intermediate_ptr, __global float* restrict param_0_ptr, __global float* restrict param_1_ptr, __read_only image2d_array_t x_4c_ptr);
__kernel void te_layout_transform_kernel(__write_only image2d_array_t te_layout_transform_ptr, __global float* restrict x_ptr);
__kernel void te_layout_transform1_kernel(__global float* restrict gv_4c_ptr, __global float* restrict te_layout_transform_ptr);
__kernel void fused_conv2d_NCHWc_OIHWo_add_relu_kernel(__write_only image2d_array_t compute_intermediate_ptr, __global float* restrict param_0_ptr, __global float* restrict param_1_ptr, __read_only image2d_array_t x_4c_ptr) {
  const sampler_t image_sampler = CLK_NORMALIZED_COORDS_FALSE | CLK_ADDRESS_CLAMP | CLK_FILTER_NEAREST;
  float conv2d_NCHWc_OIHWo_intermediate_local_ptr[32];
  float conv2d_data_pad_local_ptr[4];
  int cse_v7 = (((convert_int(get_group_id(1))) * 4) + ((convert_int(get_local_id(1))) >> 2));
  int cse_v8 = (((convert_int(get_group_id(0))) * 4) + ((convert_int(get_local_id(0))) >> 2));
  if (((bool)((((convert_int(get_group_id(1))) * 4) + ((convert_int(get_local_id(1))) >> 2)) < 7)) && ((bool)((((convert_int(get_group_id(0))) * 4) + ((convert_int(get_local_id(0))) >> 2)) < 7))) {
    vstore4(((float4)(0.000000e+00f, 0.000000e+00f, 0.000000e+00f, 0.000000e+00f)), 0, conv2d_NCHWc_OIHWo_intermediate_local_ptr + 0);
  }
  if (((bool)((((convert_int(get_group_id(1))) * 4) + ((convert_int(get_local_id(1))) >> 2)) < 7)) && ((bool)((((convert_int(get_group_id(0))) * 4) + ((convert_int(get_local_id(0))) >> 2)) < 7))) {
    vstore4(((float4)(0.000000e+00f, 0.000000e+00f, 0.000000e+00f, 0.000000e+00f)), 0, conv2d_NCHWc_OIHWo_intermediate_local_ptr + 4);
  }
  if (((bool)((((convert_int(get_group_id(1))) * 4) + ((convert_int(get_local_id(1))) >> 2)) < 7)) && ((bool)((((convert_int(get_group_id(0))) * 4) + ((convert_int(get_local_id(0))) >> 2)) < 7))) {
    vstore4(((float4)(0.000000e+00f, 0.000000e+00f, 0.000000e+00f, 0.000000e+00f)), 0, conv2d_NCHWc_OIHWo_intermediate_local_ptr + 8);
  }
  if (((bool)((((convert_int(get_group_id(1))) * 4) + ((convert_int(get_local_id(1))) >> 2)) < 7)) && ((bool)((((convert_int(get_group_id(0))) * 4) + ((convert_int(get_local_id(0))) >> 2)) < 7))) {
    vstore4(((float4)(0.000000e+00f, 0.000000e+00f, 0.000000e+00f, 0.000000e+00f)), 0, conv2d_NCHWc_OIHWo_intermediate_local_ptr + 12);
  }
  int cse_v1 = ((convert_int(get_group_id(0))) * 16);
  int cse_v2 = ((convert_int(get_group_id(1))) * 448);
  int cse_v3 = ((convert_int(get_local_id(1))) * 28);
  for (int ic_0 = 0; ic_0 < 4; ++ic_0) {
    for (int kh = 0; kh < 3; ++kh) {
      for (int kw = 0; kw < 3; ++kw) {
        if (((bool)((((convert_int(get_group_id(1))) * 8) + (((convert_int(get_local_id(1))) + kh) >> 1)) < 15)) && ((bool)((((convert_int(get_group_id(0))) * 8) + (((convert_int(get_local_id(0))) + kw) >> 1)) < 15))) {
          int cse_v9 = ((((convert_int(get_group_id(1))) * 16) + (convert_int(get_local_id(1)))) + kh);
          int cse_v10 = ((((convert_int(get_group_id(0))) * 16) + (convert_int(get_local_id(0)))) + kw);
          float4 condval;
          if (((bool)(((bool)(((bool)(1 <= ((((convert_int(get_group_id(1))) * 16) + (convert_int(get_local_id(1)))) + kh))) && ((bool)(((((convert_int(get_group_id(1))) * 16) + (convert_int(get_local_id(1)))) + kh) < 29)))) && ((bool)(1 <= ((((convert_int(get_group_id(0))) * 16) + (convert_int(get_local_id(0)))) + kw))))) && ((bool)(((((convert_int(get_group_id(0))) * 16) + (convert_int(get_local_id(0)))) + kw) < 29))) {
            float4 v_ = as_float4(READ_IMAGEF(x_4c_ptr, image_sampler, ((int4)(((((((((ic_0 * 784) + ((convert_int(get_group_id(1))) * 448)) + (kh * 28)) + ((convert_int(get_local_id(1))) * 28)) + ((convert_int(get_group_id(0))) * 16)) + (convert_int(get_local_id(0)))) + kw) - 29), 0, 0, 0))));
            condval = v_;
          } else {
            condval = ((float4)(0.000000e+00f, 0.000000e+00f, 0.000000e+00f, 0.000000e+00f));
          }
          vstore4(condval, 0, conv2d_data_pad_local_ptr + 0);
        }
        for (int ic_1 = 0; ic_1 < 4; ++ic_1) {
          for (int i4 = 0; i4 < 4; ++i4) {
            int cse_v12 = (((((ic_0 * 144) + (ic_1 * 36)) + (kh * 12)) + (kw * 4)) + i4);
            if (((bool)((((convert_int(get_group_id(1))) * 4) + ((convert_int(get_local_id(1))) >> 2)) < 7)) && ((bool)((((convert_int(get_group_id(0))) * 4) + ((convert_int(get_local_id(0))) >> 2)) < 7))) {
              conv2d_NCHWc_OIHWo_intermediate_local_ptr[i4] = (conv2d_NCHWc_OIHWo_intermediate_local_ptr[i4] + (conv2d_data_pad_local_ptr[ic_1] * param_0_ptr[(((((ic_0 * 144) + (ic_1 * 36)) + (kh * 12)) + (kw * 4)) + i4)]));
            }
            if (((bool)((((convert_int(get_group_id(1))) * 4) + ((convert_int(get_local_id(1))) >> 2)) < 7)) && ((bool)((((convert_int(get_group_id(0))) * 4) + ((convert_int(get_local_id(0))) >> 2)) < 7))) {
              int cse_v4 = (i4 + 4);
              conv2d_NCHWc_OIHWo_intermediate_local_ptr[(i4 + 4)] = (conv2d_NCHWc_OIHWo_intermediate_local_ptr[(i4 + 4)] + (conv2d_data_pad_local_ptr[ic_1] * param_0_ptr[((((((ic_0 * 144) + (ic_1 * 36)) + (kh * 12)) + (kw * 4)) + i4) + 576)]));
            }
            if (((bool)((((convert_int(get_group_id(1))) * 4) + ((convert_int(get_local_id(1))) >> 2)) < 7)) && ((bool)((((convert_int(get_group_id(0))) * 4) + ((convert_int(get_local_id(0))) >> 2)) < 7))) {
              int cse_v5 = (i4 + 8);
              conv2d_NCHWc_OIHWo_intermediate_local_ptr[(i4 + 8)] = (conv2d_NCHWc_OIHWo_intermediate_local_ptr[(i4 + 8)] + (conv2d_data_pad_local_ptr[ic_1] * param_0_ptr[((((((ic_0 * 144) + (ic_1 * 36)) + (kh * 12)) + (kw * 4)) + i4) + 1152)]));
            }
            if (((bool)((((convert_int(get_group_id(1))) * 4) + ((convert_int(get_local_id(1))) >> 2)) < 7)) && ((bool)((((convert_int(get_group_id(0))) * 4) + ((convert_int(get_local_id(0))) >> 2)) < 7))) {
              int cse_v6 = (i4 + 12);
              conv2d_NCHWc_OIHWo_intermediate_local_ptr[(i4 + 12)] = (conv2d_NCHWc_OIHWo_intermediate_local_ptr[(i4 + 12)] + (conv2d_data_pad_local_ptr[ic_1] * param_0_ptr[((((((ic_0 * 144) + (ic_1 * 36)) + (kh * 12)) + (kw * 4)) + i4) + 1728)]));
            }
          }
        }
      }
    }
  }
  int cse_v11 = (((((convert_int(get_group_id(1))) * 448) + ((convert_int(get_local_id(1))) * 28)) + ((convert_int(get_group_id(0))) * 16)) + (convert_int(get_local_id(0))));
  if (((bool)((((convert_int(get_group_id(1))) * 4) + ((convert_int(get_local_id(1))) >> 2)) < 7)) && ((bool)((((convert_int(get_group_id(0))) * 4) + ((convert_int(get_local_id(0))) >> 2)) < 7))) {
    float4 v__1 = max((vload4(0, conv2d_NCHWc_OIHWo_intermediate_local_ptr + 0) + vload4(0, param_1_ptr + 0)), ((float4)(0.000000e+00f, 0.000000e+00f, 0.000000e+00f, 0.000000e+00f)));
    write_imagef(compute_intermediate_ptr, (int4)((((((convert_int(get_group_id(1))) * 448) + ((convert_int(get_local_id(1))) * 28)) + ((convert_int(get_group_id(0))) * 16)) + (convert_int(get_local_id(0)))), 0, 0, 0), as_float4(v__1));
  }
  if (((bool)((((convert_int(get_group_id(1))) * 4) + ((convert_int(get_local_id(1))) >> 2)) < 7)) && ((bool)((((convert_int(get_group_id(0))) * 4) + ((convert_int(get_local_id(0))) >> 2)) < 7))) {
    float4 v__2 = max((vload4(0, conv2d_NCHWc_OIHWo_intermediate_local_ptr + 4) + vload4(0, param_1_ptr + 4)), ((float4)(0.000000e+00f, 0.000000e+00f, 0.000000e+00f, 0.000000e+00f)));
    write_imagef(compute_intermediate_ptr, (int4)(((((((convert_int(get_group_id(1))) * 448) + ((convert_int(get_local_id(1))) * 28)) + ((convert_int(get_group_id(0))) * 16)) + (convert_int(get_local_id(0)))) + 784), 0, 0, 0), as_float4(v__2));
  }
  if (((bool)((((convert_int(get_group_id(1))) * 4) + ((convert_int(get_local_id(1))) >> 2)) < 7)) && ((bool)((((convert_int(get_group_id(0))) * 4) + ((convert_int(get_local_id(0))) >> 2)) < 7))) {
    float4 v__3 = max((vload4(0, conv2d_NCHWc_OIHWo_intermediate_local_ptr + 8) + vload4(0, param_1_ptr + 8)), ((float4)(0.000000e+00f, 0.000000e+00f, 0.000000e+00f, 0.000000e+00f)));
    write_imagef(compute_intermediate_ptr, (int4)(((((((convert_int(get_group_id(1))) * 448) + ((convert_int(get_local_id(1))) * 28)) + ((convert_int(get_group_id(0))) * 16)) + (convert_int(get_local_id(0)))) + 1568), 0, 0, 0), as_float4(v__3));
  }
  if (((bool)((((convert_int(get_group_id(1))) * 4) + ((convert_int(get_local_id(1))) >> 2)) < 7)) && ((bool)((((convert_int(get_group_id(0))) * 4) + ((convert_int(get_local_id(0))) >> 2)) < 7))) {
    float4 v__4 = max((vload4(0, conv2d_NCHWc_OIHWo_intermediate_local_ptr + 12) + vload4(0, param_1_ptr + 12)), ((float4)(0.000000e+00f, 0.000000e+00f, 0.000000e+00f, 0.000000e+00f)));
    write_imagef(compute_intermediate_ptr, (int4)(((((((convert_int(get_group_id(1))) * 448) + ((convert_int(get_local_id(1))) * 28)) + ((convert_int(get_group_id(0))) * 16)) + (convert_int(get_local_id(0)))) + 2352), 0, 0, 0), as_float4(v__4));
  }
}

// Function: te_layout_transform_kernel
__kernel void fused_conv2d_NCHWc_OIHWo1_add1_relu1_kernel(__global float* restrict compute_intermediate_ptr, __read_only image2d_array_t lv3_4c_ptr, __global float* restrict param_0_ptr, __global float* restrict param_1_ptr);
__kernel void fused_conv2d_NCHWc_OIHWo_add_relu_kernel(__write_only image2d_array_t compute_intermediate_ptr, __global float* restrict param_0_ptr, __global float* restrict param_1_ptr, __read_only image2d_array_t x_4c_ptr);
__kernel void te_layout_transform_kernel(__write_only image2d_array_t te_layout_transform_ptr, __global float* restrict x_ptr);
__kernel void te_layout_transform1_kernel(__global float* restrict gv_4c_ptr, __global float* restrict te_layout_transform_ptr);
__kernel void te_layout_transform_kernel(__write_only image2d_array_t te_layout_transform_ptr, __global float* restrict x_ptr) {
  const sampler_t image_sampler = CLK_NORMALIZED_COORDS_FALSE | CLK_ADDRESS_CLAMP | CLK_FILTER_NEAREST;
  float x_local_ptr[4];
  int cse_v1 = ((convert_int(get_local_id(0))) % 28);
  int cse_v2 = ((((convert_int(get_group_id(0))) * 2) + ((convert_int(get_local_id(0))) / 112)) / 7);
  int cse_v3 = (((((convert_int(get_group_id(0))) * 8) + ((convert_int(get_local_id(0))) / 28)) % 28) * 28);
  for (int ax0 = 0; ax0 < 4; ++ax0) {
    x_local_ptr[ax0] = x_ptr[((((((((convert_int(get_group_id(0))) * 2) + ((convert_int(get_local_id(0))) / 112)) / 7) * 3136) + (ax0 * 784)) + (((((convert_int(get_group_id(0))) * 8) + ((convert_int(get_local_id(0))) / 28)) % 28) * 28)) + ((convert_int(get_local_id(0))) % 28))];
  }
  float4 v_ = vload4(0, x_local_ptr + 0);
  write_imagef(te_layout_transform_ptr, (int4)((((((((convert_int(get_group_id(0))) * 2) + ((convert_int(get_local_id(0))) / 112)) / 7) * 784) + (((((convert_int(get_group_id(0))) * 8) + ((convert_int(get_local_id(0))) / 28)) % 28) * 28)) + ((convert_int(get_local_id(0))) % 28)), 0, 0, 0), as_float4(v_));
}

// Function: te_layout_transform1_kernel
__kernel void fused_conv2d_NCHWc_OIHWo1_add1_relu1_kernel(__global float* restrict compute_intermediate_ptr, __read_only image2d_array_t lv3_4c_ptr, __global float* restrict param_0_ptr, __global float* restrict param_1_ptr);
__kernel void fused_conv2d_NCHWc_OIHWo_add_relu_kernel(__write_only image2d_array_t compute_intermediate_ptr, __global float* restrict param_0_ptr, __global float* restrict param_1_ptr, __read_only image2d_array_t x_4c_ptr);
__kernel void te_layout_transform_kernel(__write_only image2d_array_t te_layout_transform_ptr, __global float* restrict x_ptr);
__kernel void te_layout_transform1_kernel(__global float* restrict gv_4c_ptr, __global float* restrict te_layout_transform_ptr);
__kernel void te_layout_transform1_kernel(__global float* restrict gv_4c_ptr, __global float* restrict te_layout_transform_ptr) {
  if ((((convert_int(get_group_id(0))) * 8) + ((convert_int(get_local_id(0))) >> 5)) < 49) {
    int cse_v1 = ((convert_int(get_local_id(0))) & 3);
    int cse_v2 = (((convert_int(get_group_id(0))) * 32) + ((convert_int(get_local_id(0))) >> 3));
    int cse_v3 = ((((convert_int(get_group_id(0))) * 64) + ((convert_int(get_local_id(0))) >> 2)) % 14);
    te_layout_transform_ptr[((((((((convert_int(get_group_id(0))) * 16) + ((convert_int(get_local_id(0))) >> 4)) / 49) * 784) + (((convert_int(get_local_id(0))) & 3) * 196)) + ((((((convert_int(get_group_id(0))) * 32) + ((convert_int(get_local_id(0))) >> 3)) % 98) / 7) * 14)) + ((((convert_int(get_group_id(0))) * 64) + ((convert_int(get_local_id(0))) >> 2)) % 14))] = gv_4c_ptr[(((((((convert_int(get_group_id(0))) * 32) + ((convert_int(get_local_id(0))) >> 3)) / 7) * 56) + (((((convert_int(get_group_id(0))) * 64) + ((convert_int(get_local_id(0))) >> 2)) % 14) * 4)) + ((convert_int(get_local_id(0))) & 3))];
  }
}

