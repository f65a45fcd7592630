set datafile missing '?'
set terminal pngcairo size 1100,600 font 'sans,11' noenhanced
set output 'results/study/report/fmnist-mlp-lr-heatmap-sqrt-mean.png'
set title 'fmnist-mlp: final test accuracy (%), lr_scaling sqrt, reduction mean'
set xlabel 'replicas'
set ylabel 'lr at base batch'
set xtics ('1' 0, '2' 1, '4' 2, '8' 3)
set ytics ('0.025' 0, '0.05' 1, '0.1' 2)
set xrange [-0.5:3.5]
set yrange [-0.5:2.5]
set cblabel 'test accuracy (%)'
set palette defined (0 '#b2182b', 50 '#fddbc7', 100 '#2166ac')
set cbrange [*:*]
plot 'results/study/report/data/fmnist-mlp-lr-heatmap-sqrt-mean.dat' using 1:2:3 with image notitle, 'results/study/report/data/fmnist-mlp-lr-heatmap-sqrt-mean.dat' using 1:2:(sprintf('%.1f', $3)) with labels font 'sans,12' notitle
set terminal svg size 1100,600 font 'sans,11' noenhanced
set output 'results/study/report/fmnist-mlp-lr-heatmap-sqrt-mean.svg'
set title 'fmnist-mlp: final test accuracy (%), lr_scaling sqrt, reduction mean'
set xlabel 'replicas'
set ylabel 'lr at base batch'
set xtics ('1' 0, '2' 1, '4' 2, '8' 3)
set ytics ('0.025' 0, '0.05' 1, '0.1' 2)
set xrange [-0.5:3.5]
set yrange [-0.5:2.5]
set cblabel 'test accuracy (%)'
set palette defined (0 '#b2182b', 50 '#fddbc7', 100 '#2166ac')
set cbrange [*:*]
plot 'results/study/report/data/fmnist-mlp-lr-heatmap-sqrt-mean.dat' using 1:2:3 with image notitle, 'results/study/report/data/fmnist-mlp-lr-heatmap-sqrt-mean.dat' using 1:2:(sprintf('%.1f', $3)) with labels font 'sans,12' notitle
set output
